"""A real HTTP proxy on loopback in front of a real plimsolld (the standard library's HTTP
server and client): it passes everything through, except that it may rewrite run requests on
the way in and answers on the way out, or swap the answers of two runs."""

from __future__ import annotations

import http.client
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable, Optional
from urllib.parse import urlsplit

Rewrite = Callable[[Any], None]


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
    ) -> None:
        u = urlsplit(upstream)
        self.upstream = (u.hostname or "127.0.0.1", u.port or 80)
        self.request = request
        self.response = response
        self.raw_response = raw_response
        self.providers_response = providers_response
        self.swap = swap
        self.runs_seen = 0
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

    def _forward(self, method: str, path: str, headers: dict[str, str], body: bytes) -> tuple[int, bytes]:
        conn = http.client.HTTPConnection(*self.upstream, timeout=120)
        try:
            conn.request(method, path, body=body if method == "POST" else None, headers=headers)
            r = conn.getresponse()
            return r.status, r.read()
        finally:
            conn.close()

    def _serve(self, h: BaseHTTPRequestHandler, method: str) -> None:
        length = int(h.headers.get("content-length") or 0)
        body = h.rfile.read(length) if length else b""
        headers = {k: v for k, v in h.headers.items() if k.lower() in ("authorization", "content-type")}
        is_run = method == "POST" and h.path == "/v1/runs"
        if is_run and self.request is not None:
            v = json.loads(body)
            self.request(v)
            body = json.dumps(v).encode()
        status, answer = self._forward(method, h.path, headers, body)
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
        h.send_header("content-type", "application/json")
        h.send_header("content-length", str(len(answer)))
        h.send_header("connection", "close")
        h.end_headers()
        h.wfile.write(answer)
        h.wfile.flush()
        h.close_connection = True

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
