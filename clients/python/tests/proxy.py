"""A real HTTP proxy on loopback in front of a real plimsolld (the standard library's HTTP
server and client): it passes everything through, except that it may rewrite run requests on
the way in and answers on the way out, or swap the answers of two runs, or rewrite (or
replace) the run responses of session calls, whole or as the last line of a stream, and the
answers to a snapshot, a fork or an open from a snapshot."""

from __future__ import annotations

import http.client
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable, Optional
from urllib.parse import urlsplit

Rewrite = Callable[[Any], None]
# Given a session call's path and its run response (or, streamed, its last line's error
# answer), mutates it in place or returns another value to send instead.
SessionRewrite = Callable[[str, Any], Optional[Any]]

_NDJSON = "application/x-ndjson"


def is_session_call(method: str, path: str) -> bool:
    """A cell, steps, or a file's PUT or GET: a call answered by a run response."""
    if not path.startswith("/v1/sessions/"):
        return False
    route = path.split("?", 1)[0]
    if method == "POST":
        return route.endswith("/cells") or route.endswith("/steps")
    return method in ("PUT", "GET") and "/files/" in route


def is_snapshot_call(method: str, path: str) -> bool:
    """A snapshot, a fork, or a session opened from a snapshot: answered by a snapshot, a fork
    answer, or a session."""
    if method != "POST":
        return False
    if path.startswith("/v1/sessions/"):
        return path.endswith("/snapshot") or path.endswith("/fork")
    return path.startswith("/v1/snapshots/") and path.endswith("/sessions")


class Proxy:
    def __init__(
        self,
        upstream: str,
        *,
        request: Optional[Rewrite] = None,
        response: Optional[Rewrite] = None,
        raw_response: Optional[Callable[[bytes], bytes]] = None,
        providers_response: Optional[Rewrite] = None,
        swap: bool = False,
        session_response: Optional[SessionRewrite] = None,
        open_response: Optional[Rewrite] = None,
        snapshot_response: Optional[SessionRewrite] = None,
    ) -> None:
        u = urlsplit(upstream)
        self.upstream = (u.hostname or "127.0.0.1", u.port or 80)
        self.request = request
        self.response = response
        self.raw_response = raw_response
        self.providers_response = providers_response
        self.swap = swap
        self.session_response = session_response
        self.open_response = open_response
        self.snapshot_response = snapshot_response
        self.runs_seen = 0
        self.session_calls_seen = 0
        self._held: dict[int, tuple[int, bytes]] = {}
        self._taken = 0
        self._cv = threading.Condition()
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def do_GET(self) -> None:
                proxy._serve(self, "GET")

            def do_POST(self) -> None:
                proxy._serve(self, "POST")

            def do_PUT(self) -> None:
                proxy._serve(self, "PUT")

            def do_DELETE(self) -> None:
                proxy._serve(self, "DELETE")

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self._thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def __enter__(self) -> "Proxy":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _forward(
        self, method: str, path: str, headers: dict[str, str], body: bytes
    ) -> tuple[int, bytes, str]:
        conn = http.client.HTTPConnection(*self.upstream, timeout=120)
        try:
            sends = method in ("POST", "PUT")
            conn.request(method, path, body=body if sends else None, headers=headers)
            r = conn.getresponse()
            return r.status, r.read(), r.getheader("content-type") or "application/json"
        finally:
            conn.close()

    def _serve(self, h: BaseHTTPRequestHandler, method: str) -> None:
        length = int(h.headers.get("content-length") or 0)
        body = h.rfile.read(length) if length else b""
        passed = ("authorization", "content-type", "accept", "plimsoll-request-id")
        headers = {k: v for k, v in h.headers.items() if k.lower() in passed}
        is_run = method == "POST" and h.path == "/v1/runs"
        if is_run and self.request is not None:
            v = json.loads(body)
            self.request(v)
            body = json.dumps(v).encode()
        status, answer, content_type = self._forward(method, h.path, headers, body)
        if method == "POST" and h.path == "/v1/sessions" and self.open_response is not None:
            v = json.loads(answer)
            self.open_response(v)
            answer = json.dumps(v).encode()
        if is_snapshot_call(method, h.path) and self.snapshot_response is not None:
            v = json.loads(answer)
            out = self.snapshot_response(h.path, v)
            answer = json.dumps(v if out is None else out).encode()
        if is_session_call(method, h.path):
            with self._cv:
                self.session_calls_seen += 1
            if self.session_response is not None:
                answer = self._session_rewrite(h.path, content_type, answer)
        if method == "GET" and h.path == "/v1/providers" and self.providers_response is not None:
            v = json.loads(answer)
            self.providers_response(v)
            answer = json.dumps(v).encode()
        if is_run:
            with self._cv:
                n = self.runs_seen
                self.runs_seen += 1
            if self.response is not None:
                v = json.loads(answer)
                self.response(v)
                answer = json.dumps(v).encode()
            if self.raw_response is not None:
                answer = self.raw_response(answer)
            if self.swap:
                status, answer = self._swapped(n, (status, answer))
        h.send_response(status)
        h.send_header("content-type", content_type)
        h.send_header("content-length", str(len(answer)))
        h.send_header("connection", "close")
        h.end_headers()
        h.wfile.write(answer)
        h.wfile.flush()
        h.close_connection = True

    def _session_rewrite(self, path: str, content_type: str, answer: bytes) -> bytes:
        assert self.session_response is not None
        if not content_type.startswith(_NDJSON):
            v = json.loads(answer)
            out = self.session_response(path, v)
            return json.dumps(v if out is None else out).encode()
        # A stream: chunks pass as they are; the last line's response or error is rewritten.
        lines = answer.split(b"\n")
        if lines and lines[-1] == b"":
            lines.pop()
        last = json.loads(lines[-1])
        (kind, v), = last.items()
        out = self.session_response(path, v)
        lines[-1] = json.dumps({kind: v if out is None else out}).encode()
        return b"\n".join(lines) + b"\n"

    def _swapped(self, n: int, answer: tuple[int, bytes]) -> tuple[int, bytes]:
        """Holds answers until two runs are in, then gives each the other's."""
        with self._cv:
            self._held[n] = answer
            self._cv.notify_all()
            ok = self._cv.wait_for(lambda: len(self._held) + self._taken >= 2, timeout=120)
            assert ok, "the swapping proxy saw only one run"
            other = next(k for k in self._held if k != n)
            self._taken += 1
            return self._held.pop(other)
