"""A real HTTP webhook receiver for the outbox tests: records every POST (path, headers, body, when).

``port``: listen there (a port reserved earlier with ``free_port`` and refused until now: a receiver
that was down comes up). ``hold``: the first POST is answered only once the event is set (a worker
killed while it waits never learns that its POST arrived).
"""

from __future__ import annotations

import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest


class OutboxReceiver:
    def __init__(self, port: int = 0, hold: threading.Event | None = None) -> None:
        self.posts: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        self._hold = hold
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                with receiver._lock:
                    receiver.posts.append(
                        {"path": self.path, "headers": dict(self.headers), "body": body, "at": time.time()}
                    )
                    first = len(receiver.posts) == 1
                if first and receiver._hold is not None:
                    receiver._hold.wait(120)
                try:
                    self.send_response(204)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                except OSError:  # the sender was killed meanwhile
                    pass

            def log_message(self, *args: object) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def wait_for(self, count: int, timeout_s: float = 60.0) -> list[dict[str, Any]]:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            with self._lock:
                if len(self.posts) >= count:
                    return list(self.posts)
            time.sleep(0.05)
        pytest.fail(f"{len(self.posts)} webhook POSTs arrived, expected {count}")

    def close(self) -> None:
        if self._hold is not None:
            self._hold.set()
        self.httpd.shutdown()
        self.httpd.server_close()
