"""A real HTTP webhook receiver on loopback for tests: records every request, answers as told."""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Receiver:
    """``answer(request) -> (status, headers)`` decides each response; default 200. ``start``/``stop``
    may be called repeatedly on the same port to simulate an endpoint that is down for a while."""

    def __init__(self, port: int | None = None, answer: Callable[[dict[str, Any]], tuple[int, dict[str, str]]] | None = None):
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.requests: list[dict[str, Any]] = []
        self.answer = answer or (lambda req: (200, {}))
        self.server: ThreadingHTTPServer | None = None
        self.lock = threading.Lock()

    def start(self) -> Receiver:
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802
                body = self.rfile.read(int(self.headers.get("content-length", "0")))
                req = {"path": self.path, "headers": {k.lower(): v for k, v in self.headers.items()}, "body": body, "at": time.time()}
                try:
                    req["json"] = json.loads(body)
                except ValueError:
                    req["json"] = None
                status, headers = outer.answer(req)
                req["status"] = status
                with outer.lock:
                    outer.requests.append(req)
                self.send_response(status)
                for k, v in headers.items():
                    self.send_header(k, v)
                self.send_header("content-length", "2")
                self.end_headers()
                self.wfile.write(b"ok")

            def log_message(self, *args: Any) -> None:
                pass

        ThreadingHTTPServer.allow_reuse_address = True
        self.server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
        return self

    def stop(self) -> None:
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()
            self.server = None

    def accepted(self) -> list[dict[str, Any]]:
        with self.lock:
            return [r for r in self.requests if 200 <= r["status"] < 300]

    def __enter__(self) -> Receiver:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()
