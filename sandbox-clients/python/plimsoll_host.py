"""plimsoll_host: the in-sandbox client of the plimsoll broker (docs/capability-grants.md).

On the path of a run that has a grant::

    import plimsoll_host as host
    order = host.get("/orders/42")
    host.post("/orders", {"item": "tea"})

``get``, ``post``, ``put``, ``patch`` and ``delete`` send one call to the broker over the
run's own channel and return the response body (JSON, decoded). A status outside 200-299, or
a call the broker refuses, raises :class:`HostError` with ``status`` (the API's status, or
``None`` when the API was not called) and ``code``.

The channel is descriptor 3, inherited (process tier), or the Unix socket named by
``PLIMSOLL_BROKER_SOCKET`` (container, gVisor, VM). The code never sees a credential: the
broker, outside the sandbox, attaches it.
"""

import json
import os
import socket
import struct
import threading

__all__ = ["HostError", "get", "post", "put", "patch", "delete"]

_BROKER_FD = 3
_lock = threading.Lock()
_channel = None
_next_id = 1


class HostError(Exception):
    """A call that did not get a 2xx answer from the API."""

    def __init__(self, message, status=None, code=None, body=None):
        super().__init__(message)
        self.status = status
        self.code = code
        self.body = body


def _open():
    global _channel
    if _channel is None:
        path = os.environ.get("PLIMSOLL_BROKER_SOCKET")
        if path:
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            s.connect(path)
        else:
            s = socket.socket(fileno=_BROKER_FD)
        s.setblocking(True)
        _channel = s
    return _channel


def _read_exact(s, n):
    chunks = []
    while n > 0:
        chunk = s.recv(min(n, 1 << 20))
        if not chunk:
            raise HostError("the broker channel is closed", code="channel")
        chunks.append(chunk)
        n -= len(chunk)
    return b"".join(chunks)


def _call(method, path, body=None):
    global _next_id
    if not isinstance(path, str):
        raise TypeError('the path must be a string such as "/orders/42"')
    message = {"id": 0, "method": method, "path": path}
    if body is not None:
        message["body"] = body
    with _lock:
        message["id"] = _next_id
        _next_id += 1
        data = json.dumps(message, separators=(",", ":")).encode("utf-8")
        try:
            s = _open()
            s.sendall(struct.pack(">I", len(data)) + data)
            (length,) = struct.unpack(">I", _read_exact(s, 4))
            reply = json.loads(_read_exact(s, length).decode("utf-8"))
        except OSError as e:
            raise HostError(f"broker channel failed: {e}", code="channel") from None
    what = f"{method} {path}"
    if "error" in reply:
        err = reply["error"]
        raise HostError(f"{what}: {err.get('message')}", code=err.get("code"))
    status = reply.get("status")
    if not (isinstance(status, int) and 200 <= status <= 299):
        raise HostError(f"{what}: HTTP status {status}", status=status, code="status", body=reply.get("body"))
    return reply.get("body")


def get(path):
    """GET `path`; returns the decoded JSON body."""
    return _call("GET", path)


def post(path, body=None):
    """POST `body` (any JSON value; None sends no body) to `path`; returns the decoded JSON body."""
    return _call("POST", path, body)


def put(path, body=None):
    """PUT `body` to `path`; returns the decoded JSON body."""
    return _call("PUT", path, body)


def patch(path, body=None):
    """PATCH `body` to `path`; returns the decoded JSON body."""
    return _call("PATCH", path, body)


def delete(path):
    """DELETE `path`; returns the decoded JSON body."""
    return _call("DELETE", path)
