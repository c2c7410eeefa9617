"""A webhook receiver that answers with a redirect is not followed: urllib would otherwise turn the
signed POST into a GET to the Location, a host the operator's webhook list never named (SSRF through
an allowed receiver). Real HTTP servers on 127.0.0.1; the worker's real sender."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from sandfleet.core.settings import Settings
from sandfleet.worker.approval.webhook import post as approval_post
from sandfleet.worker.webhooks.sender import Delivery, WebhookSender


class Servers:
    """``allowed`` answers every POST with 302 to ``internal``, which records any request reaching it."""

    def __init__(self) -> None:
        self.internal_hits: list[str] = []
        hits = self.internal_hits

        class Internal(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                hits.append(f"GET {self.path}")
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            do_POST = do_GET

            def log_message(self, *args: object) -> None:
                pass

        self.internal = ThreadingHTTPServer(("127.0.0.1", 0), Internal)
        location = f"http://127.0.0.1:{self.internal.server_address[1]}/secret-admin"

        class Redirecting(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                self.rfile.read(int(self.headers.get("Content-Length", "0")))
                self.send_response(302)
                self.send_header("Location", location)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        self.allowed = ThreadingHTTPServer(("127.0.0.1", 0), Redirecting)
        self.url = f"http://127.0.0.1:{self.allowed.server_address[1]}/hook"
        for server in (self.internal, self.allowed):
            threading.Thread(target=server.serve_forever, daemon=True).start()

    def close(self) -> None:
        for server in (self.internal, self.allowed):
            server.shutdown()
            server.server_close()


@pytest.fixture
def servers() -> Iterator[Servers]:
    made = Servers()
    yield made
    made.close()


def test_a_completion_webhook_answered_with_a_redirect_is_not_followed(servers: Servers) -> None:
    sender = WebhookSender(Settings(webhook_retries=1, webhook_backoff_s=0.01), sleep=lambda _s: None)
    try:
        outcome = sender._deliver(Delivery(servers.url, "job.ended", "job-1", b"{}", "sha256=00", 1))
    finally:
        sender.close()
    assert not outcome.delivered and outcome.status == 302 and outcome.tries == 2
    assert servers.internal_hits == []


def test_an_approval_webhook_answered_with_a_redirect_is_not_followed(servers: Servers) -> None:
    with pytest.raises(Exception, match="302"):
        approval_post(servers.url, "secret", {"request": "apr-1"})
    assert servers.internal_hits == []
