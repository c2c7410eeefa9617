"""Real ``sandfleet worker`` processes for the tests, and their cleanup (arq's one worker fixture is the
model: the ``fleet_worker`` fixtures of tests/conftest.py are a ``WorkerFactory``).

A worker is one ``LocalFleet`` worker on the test's Redis under a fresh key prefix, with its own folder
(its data, replay scripts, signing key, log). Stopping it is a warm shutdown (SIGTERM, SIGKILL after a
minute) and the removal of every container still labelled with its owner; cleaning it deletes every
key under its prefix (the broker queue included) and the folder the factory made for it.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import redis

from sandfleet.core.settings import Settings
from sandfleet.fleet.local import FleetConfig, LocalFleet, WorkerProcess
from sandfleet.producer.client import Client

from .approvers import APPROVERS, Approvers, make_approvers

JOB_TIMEOUT_S = 120.0
SANDFLEET = str(Path(sys.executable).with_name("sandfleet"))
ORDERS = (
    "sandfleet.worker.tools.examples.orders"  # ``tools=``: the example order tools (the reference data's)
)
SCRIPT_NAME = "script.json"  # a script given as JSON is written here, in the worker's scripts folder

# A replay script for the worker's jobs: its JSON (written to ``scripts_dir/script.json``), or a
# function that writes the script files into ``scripts_dir`` and returns the one jobs name.
Script = Mapping[str, Any] | Callable[[Path], Path]


@dataclass
class FleetWorker:
    """One real ``sandfleet worker`` (of a LocalFleet on the test's Redis) and a client of its fleet.

    ``model``: what the tests' jobs name (``replay:FILE`` of the script it was started with, else the
    fleet's default replay script); ``approvers``: the approvers file and keys it trusts, when it gates.
    """

    fleet: LocalFleet
    worker: WorkerProcess
    settings: Settings
    client: Client
    model: str = ""
    trusted_approvers: Approvers | None = field(default=None, repr=False)

    @property
    def process(self) -> subprocess.Popen[bytes]:
        return self.worker.process

    @property
    def folder(self) -> Path:
        return self.fleet.folder

    @property
    def data_dir(self) -> Path:
        """SANDFLEET_DATA_DIR: the reference data, and the ledger of the approval tests' tools."""
        return self.fleet.data_dir

    @property
    def scripts_dir(self) -> Path:
        """The worker's SANDFLEET_REPLAY_SCRIPTS_DIR: a job's replay:FILE must be in there."""
        return self.fleet.scripts_dir

    @property
    def metrics_url(self) -> str:
        """Its Prometheus endpoint (started with ``metrics=True``)."""
        if self.worker.metrics_url is None:
            raise AttributeError("this worker serves no metrics: start it with metrics=True")
        return self.worker.metrics_url

    @metrics_url.setter
    def metrics_url(self, url: str) -> None:
        self.worker.metrics_url = url

    @property
    def owner_label(self) -> str:
        """The ``sandfleet.owner`` label of its containers (``host:pid:start ticks``)."""
        return self.worker.owner_label

    @property
    def approvers(self) -> Approvers:
        """The approvers it trusts (started with ``approvers=``)."""
        if self.trusted_approvers is None:
            raise AttributeError("this worker was started without approvers: pass approvers=APPROVERS")
        return self.trusted_approvers

    def log(self) -> str:
        return self.worker.log()

    def alive(self) -> bool:
        return self.worker.alive()


def fleet_settings_for(url: str, **overrides: object) -> Settings:
    """Settings with a fresh key prefix (and so a fresh queue) on the Redis at ``url``."""
    prefix = f"t{uuid.uuid4().hex[:10]}"
    return Settings(redis_url=url, key_prefix=prefix, retention_s=3600, **overrides)


def start_worker(
    settings: Settings,
    folder: Path,
    *,
    tools: str = "",
    sandboxes: int = 2,
    concurrency: int = 8,
    name: str | None = None,
    env: dict[str, str] | None = None,
    replay_scripts_dir: Path | None = None,
    model: str | None = None,
    script: Script | None = None,
    metrics: bool = False,
    approvers: Approvers | None = None,
) -> FleetWorker:
    """A worker (``name@host``, a fresh name when None) with ``settings``' Redis, key prefix and
    retention, and its signing key in ``folder/worker-state``; fails the test if it does not start.

    ``env``: more ``SANDFLEET_*`` settings for it. ``replay_scripts_dir``: its
    SANDFLEET_REPLAY_SCRIPTS_DIR (default ``folder/scripts``). ``script``: the replay script its jobs
    name (``FleetWorker.model``), or ``model`` itself. ``metrics``: it serves Prometheus metrics on a
    free port (``FleetWorker.metrics_url``). ``approvers``: it trusts their file
    (SANDFLEET_APPROVERS_FILE, unless ``env`` names one, even "").
    """
    env = dict(env or {})
    if approvers is not None:
        env = {"SANDFLEET_APPROVERS_FILE": str(approvers.file), **env}
    elif env.get("SANDFLEET_APPROVAL_TOOLS") and "SANDFLEET_APPROVERS_FILE" not in env:
        pytest.fail(
            "a worker gating tools without approvers refuses every decision: pass approvers= "
            "(or SANDFLEET_APPROVERS_FILE in env, to mean it)",
            pytrace=False,
        )
    config = FleetConfig(
        workers=0,
        concurrency=concurrency,
        sandboxes=sandboxes,
        tools=tools,
        loglevel="info",
        replay_scripts_dir=replay_scripts_dir,
        metrics=metrics,
        env={"SANDFLEET_RETENTION_S": str(settings.retention_s), "SANDFLEET_POOL_SIZE": "0", **env},
    )
    fleet = LocalFleet(config, folder, redis_url=settings.redis_url, key_prefix=settings.key_prefix)
    fleet.prepare()  # the scripts folder, before the script is written into it
    if script is not None:
        model = f"replay:{write_script(fleet.scripts_dir, script)}"
    try:
        worker = fleet.start_worker(name or f"test-{uuid.uuid4().hex[:6]}")
    except RuntimeError as e:
        fleet.stop()
        pytest.fail(f"sandfleet worker did not start: {e}")
    return FleetWorker(fleet, worker, settings, Client(settings=settings), model or fleet.model, approvers)


def write_script(scripts_dir: Path, script: Script) -> Path:
    if callable(script):
        return script(scripts_dir)
    path = scripts_dir / SCRIPT_NAME
    path.write_text(json.dumps(script))
    return path


def stop_worker(worker: FleetWorker) -> None:
    """SIGTERM (warm shutdown: the pool is drained), SIGKILL after a minute; its containers removed.
    Stopping a stopped worker does nothing."""
    worker.fleet.stop()
    worker.client.close()


def keys_under(client: redis.Redis, prefix: str) -> list[str]:
    """Every key the fleet wrote under ``prefix``, the broker queue included."""
    return sorted(client.scan_iter(match=f"{prefix}*", count=1000))


def delete_keys(redis_url: str, prefix: str) -> None:
    """Delete every key under ``prefix`` (nothing when that Redis is gone: a test stopped it)."""
    client = redis.Redis.from_url(redis_url, decode_responses=True)
    try:
        if leftovers := keys_under(client, prefix):
            client.delete(*leftovers)
    except redis.ConnectionError:
        pass
    finally:
        client.close()


def clean_up(worker: FleetWorker) -> None:
    """Stop the worker (its containers removed) and delete every key under its prefix."""
    stop_worker(worker)
    delete_keys(worker.settings.redis_url, worker.settings.key_prefix)


class WorkerFactory:
    """``start(name, **options) -> FleetWorker``: start workers; ``close()`` stops and cleans them all.

    Each worker gets a new folder (``new_folder(name)``, removed by ``close``) unless given one, and
    new settings (a fresh key prefix on ``redis_url``) unless given some: pass another worker's
    ``settings`` to start a second worker of its fleet. ``redis_url`` starts it on another Redis (one
    of ``redis_factory``'s). ``name`` names its folder; ``worker_name`` is the worker's own name
    (``NAME@host``, what it signs as; a fresh one when None). ``approvers=APPROVERS`` (for any worker that gates tools): key pairs in its
    folder, their approvers file given to the worker, its client signing with the first one's key.
    Every other option is ``start_worker``'s.

    Workers of one fleet share the first one's state folder (``SANDFLEET_WORKER_STATE_DIR``, unless
    ``env`` names one), as the workers of one host do: unpinned, a worker acts only on state signed
    with a key made in its state folder (sandfleet/core/host_keys.py), so a second worker can resume
    what the first suspended. A test of several hosts gives each its own folder in ``env``.
    """

    def __init__(self, redis_url: str, new_folder: Callable[[str], Path]) -> None:
        self.redis_url = redis_url
        self.new_folder = new_folder
        self.workers: list[FleetWorker] = []
        self.folders: list[Path] = []
        self.state_dirs: dict[tuple[str, str], str] = {}  # (redis url, key prefix) -> its state folder

    def __call__(
        self,
        name: str = "worker",
        *,
        settings: Settings | None = None,
        redis_url: str | None = None,
        folder: Path | None = None,
        approvers: tuple[str, ...] = (),
        worker_name: str | None = None,
        **options: Any,
    ) -> FleetWorker:
        if folder is None:
            folder = self.new_folder(name)
            self.folders.append(folder)
        trusted = make_approvers(folder, approvers) if approvers else None
        if settings is None:
            overrides: dict[str, object] = {}
            if trusted is not None:
                overrides = {
                    "worker_state_dir": str(folder / "worker-state"),
                    "approver_key": str(trusted.keys[approvers[0]]),
                }
            settings = fleet_settings_for(redis_url or self.redis_url, **overrides)
        fleet = (settings.redis_url, settings.key_prefix)
        env = dict(options.pop("env", None) or {})
        if fleet in self.state_dirs:
            env.setdefault("SANDFLEET_WORKER_STATE_DIR", self.state_dirs[fleet])
        worker = start_worker(settings, folder, approvers=trusted, name=worker_name, env=env, **options)
        self.state_dirs.setdefault(fleet, env.get("SANDFLEET_WORKER_STATE_DIR", str(folder / "worker-state")))
        self.workers.append(worker)
        return worker

    def close(self) -> None:
        """Stop every worker, then delete their keys (each prefix once) and the folders made here."""
        for worker in reversed(self.workers):
            stop_worker(worker)
        for url, prefix in dict.fromkeys((w.settings.redis_url, w.settings.key_prefix) for w in self.workers):
            delete_keys(url, prefix)
        for folder in self.folders:
            shutil.rmtree(folder, ignore_errors=True)
        self.workers, self.folders, self.state_dirs = [], [], {}


__all__ = [
    "APPROVERS",
    "JOB_TIMEOUT_S",
    "ORDERS",
    "SANDFLEET",
    "Approvers",
    "FleetWorker",
    "WorkerFactory",
    "clean_up",
    "delete_keys",
    "fleet_settings_for",
    "keys_under",
    "start_worker",
    "stop_worker",
]
