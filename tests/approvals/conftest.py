"""Fixtures of the approval tests: a real ``sandfleet worker`` with gated tools on the test Redis,
the replay model over HTTP (the worker's own replay server), and a real HTTP server for the webhook.

Every worker is started by ``helpers.gated_worker`` (through the ``module_fleet_worker`` factory of
tests/conftest.py) with two approvers, ``ana`` and ``bo``: their key pairs made by the real keygen
code in the worker's folder, their public keys in the approvers file the worker is given
(``SANDFLEET_APPROVERS_FILE``). The fleet's client (and the ``sandfleet`` commands of the tests) sign
with ana's key (``SANDFLEET_APPROVER_KEY``); ``worker.approvers.keys["bo"]`` is bo's.

approval_fleet   module: a worker gating ``issue_refund`` (operator policy), grace 1 s, redacting
                 ``password``, posting signed webhooks to ``webhook``; its jobs use ``model``
patient_fleet    module: the same policy, grace 10 s (a call waits in its program), requests time out at 8 s
quick_fleet      module: grace 1 s, requests time out at 3 s (a suspended job times out: the sweep)
webhook          module: a ThreadingHTTPServer on 127.0.0.1 that keeps every POST (headers, body)

A test that needs a gating worker of its own calls ``gated_worker(fleet_worker, name, env)``.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from sandfleet_testing.approvers import Approvers as Approvers
from sandfleet_testing.workers import FleetWorker, WorkerFactory

from .helpers import WEBHOOK_SECRET as WEBHOOK_SECRET
from .helpers import Webhook as Webhook
from .helpers import approval_env as approval_env
from .helpers import gated_worker


@pytest.fixture(scope="module")
def webhook() -> Iterator[Webhook]:
    received: list[tuple[dict[str, str], bytes]] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
            received.append(({k.lower(): v for k, v in self.headers.items()}, body))
            self.send_response(204)
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    hook = Webhook(f"http://127.0.0.1:{server.server_address[1]}/hook", received)
    yield hook
    server.shutdown()
    server.server_close()


@pytest.fixture(scope="module")
def approval_fleet(webhook: Webhook, module_fleet_worker: WorkerFactory) -> FleetWorker:
    return gated_worker(module_fleet_worker, "approvals", approval_env(webhook.url))


@pytest.fixture(scope="module")
def patient_fleet(module_fleet_worker: WorkerFactory) -> FleetWorker:
    env = approval_env(SANDFLEET_APPROVAL_GRACE_S="10", SANDFLEET_APPROVAL_TIMEOUT_S="8")
    return gated_worker(module_fleet_worker, "patient", env)


@pytest.fixture(scope="module")
def quick_fleet(module_fleet_worker: WorkerFactory) -> FleetWorker:
    return gated_worker(module_fleet_worker, "quick", approval_env(SANDFLEET_APPROVAL_TIMEOUT_S="3"))
