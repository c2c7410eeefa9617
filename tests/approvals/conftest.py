"""Fixtures of the approval tests: a real ``sandfleet worker`` with gated tools on the test Redis,
the replay model over HTTP (the worker's own replay server), and a real HTTP server for the webhook.

Every fleet of ``fleet_with`` has two approvers, ``ana`` and ``bo``: their key pairs made by the real
keygen code in the test's folder, their public keys in the approvers file the worker is given
(``SANDFLEET_APPROVERS_FILE``). The fleet's client (and the ``sandfleet`` commands of the tests) sign
with ana's key (``SANDFLEET_APPROVER_KEY``); ``worker.approvers.keys["bo"]`` is bo's.

approval_fleet   module: a worker gating ``issue_refund`` (operator policy), grace 1 s, redacting
                 ``password``, posting signed webhooks to ``webhook``; its jobs use ``model``
patient_fleet    module: the same policy, grace 10 s (a call waits in its program), requests time out at 8 s
quick_fleet      module: grace 1 s, requests time out at 3 s (a suspended job times out: the sweep)
webhook          module: a ThreadingHTTPServer on 127.0.0.1 that keeps every POST (headers, body)
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import redis
from fleet.helpers import FleetWorker, fleet_settings_for, keys_under, start_worker, stop_worker

from sandfleet.core.approvers import ApproversFile, make_approver_key, public_half_path, read_public_key
from sandfleet.core.settings import Settings

from .helpers import TOOLS, write_script

WEBHOOK_SECRET = "s3cret-for-tests"


@dataclass
class Webhook:
    url: str
    posts: list[tuple[dict[str, str], bytes]] = field(default_factory=list)


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


def approval_env(webhook_url: str = "", **more: str) -> dict[str, str]:
    env = {
        "SANDFLEET_APPROVAL_TOOLS": "issue_refund",
        "SANDFLEET_APPROVAL_GRACE_S": "1",
        "SANDFLEET_APPROVAL_REDACT": "password",
        "SANDFLEET_POOL_FOLLOWS_DEMAND": "false",  # no warm containers: every live one belongs to a run
    }
    if webhook_url:
        env |= {
            "SANDFLEET_APPROVAL_WEBHOOK_URL": webhook_url,
            "SANDFLEET_APPROVAL_WEBHOOK_SECRET": WEBHOOK_SECRET,
        }
    return env | more


@dataclass
class Approvers:
    """The approvers file of a test fleet and each approver's private key file."""

    file: Path
    keys: dict[str, Path]


def make_approvers(folder: Path, names: tuple[str, ...] = ("ana", "bo")) -> Approvers:
    """Key pairs for ``names`` (as `sandfleet approvers keygen` makes them) listed in an approvers file
    (as `sandfleet approvers add` lists them); made once per folder."""
    listed = ApproversFile(folder / "approvers.json")
    keys = {name: folder / "approvers" / f"{name}.pem" for name in names}
    for name, path in keys.items():
        if not path.exists():
            make_approver_key(path)
            listed.add(name, *read_public_key(public_half_path(path)))
    return Approvers(listed.path, keys)


def fleet_with(
    redis_url: str, folder: Path, env: dict[str, str], settings: Settings | None = None, **kw: object
) -> FleetWorker:
    """A worker of a new fleet, or of the fleet of ``settings`` (its key prefix), trusting the
    approvers of ``folder`` (unless ``env`` names another approvers file)."""
    approvers = make_approvers(folder)
    settings = settings or fleet_settings_for(
        redis_url, worker_state_dir=str(folder / "worker-state"), approver_key=str(approvers.keys["ana"])
    )
    env = {"SANDFLEET_APPROVERS_FILE": str(approvers.file), **env}
    worker = start_worker(settings, folder, tools=TOOLS, env=env, **kw)  # type: ignore[arg-type]
    worker.model = f"replay:{write_script(worker.scripts_dir)}"  # type: ignore[attr-defined]
    worker.approvers = approvers  # type: ignore[attr-defined]
    return worker


def cleanup(worker: FleetWorker, redis_url: str) -> None:
    stop_worker(worker)
    client = redis.Redis.from_url(redis_url, decode_responses=True)
    if leftovers := keys_under(client, worker.settings.key_prefix):
        client.delete(*leftovers)
    client.close()


@pytest.fixture(scope="module")
def approval_fleet(
    redis_server: str, tmp_path_factory: pytest.TempPathFactory, docker_engine: object, webhook: Webhook
) -> Iterator[FleetWorker]:
    folder = tmp_path_factory.mktemp("approvals")
    worker = fleet_with(redis_server, folder, approval_env(webhook.url))
    yield worker
    cleanup(worker, redis_server)


@pytest.fixture(scope="module")
def patient_fleet(
    redis_server: str, tmp_path_factory: pytest.TempPathFactory, docker_engine: object
) -> Iterator[FleetWorker]:
    folder = tmp_path_factory.mktemp("patient")
    worker = fleet_with(
        redis_server, folder, approval_env(SANDFLEET_APPROVAL_GRACE_S="10", SANDFLEET_APPROVAL_TIMEOUT_S="8")
    )
    yield worker
    cleanup(worker, redis_server)


@pytest.fixture(scope="module")
def quick_fleet(
    redis_server: str, tmp_path_factory: pytest.TempPathFactory, docker_engine: object
) -> Iterator[FleetWorker]:
    folder = tmp_path_factory.mktemp("quick")
    worker = fleet_with(redis_server, folder, approval_env(SANDFLEET_APPROVAL_TIMEOUT_S="3"))
    yield worker
    cleanup(worker, redis_server)
