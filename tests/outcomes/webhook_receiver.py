"""Real HTTP webhook receivers for the webhook tests.

``Receiver`` records every POST with the job's status in Redis at that moment, and fails the first POST
to /jobs (a retry must follow). ``OutboxReceiver`` records every POST (path, headers, body, when).
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
import redis

from sandfleet.core.webhook_signing import DELIVERY_HEADER


class Receiver:
    """A real HTTP server: records each POST (path, headers, body, the job's status in Redis then)."""

    def __init__(self, redis_url: str, prefix: str) -> None:
        self.posts: list[dict] = []  # type: ignore[type-arg]
        self.fail_first = {"/jobs": 1}  # answer the first POST to /jobs with 500
        self._lock = threading.Lock()
        self._redis = redis.Redis.from_url(redis_url, decode_responses=True)
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                delivery = self.headers[DELIVERY_HEADER]
                job_status = None
                if not delivery.startswith("batch:"):
                    job_status = receiver._redis.hget(f"{prefix}:job:{delivery}", "status")
                with receiver._lock:
                    receiver.posts.append(
                        {
                            "path": self.path,
                            "headers": dict(self.headers),
                            "body": body,
                            "job_status": job_status,
                        }
                    )
                    failing = receiver.fail_first.get(self.path, 0) > 0
                    if failing:
                        receiver.fail_first[self.path] -= 1
                self.send_response(500 if failing else 204)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def wait_for(self, count: int, timeout_s: float = 30.0) -> list[dict]:  # type: ignore[type-arg]
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            with self._lock:
                if len(self.posts) >= count:
                    return list(self.posts)
            time.sleep(0.1)
        pytest.fail(f"{len(self.posts)} webhook POSTs arrived, expected {count}")

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        self._redis.close()


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
