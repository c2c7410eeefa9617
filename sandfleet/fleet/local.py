"""A local fleet for ``sandfleet loadtest --local`` and the benchmarks: started here, stopped here.

It owns, in a scratch folder: a ``redis-server`` on a free loopback port (no persistence), the
reference data, a replay model script whose every answer is the given program, and ``workers``
``sandfleet worker`` subprocesses. :meth:`LocalFleet.stop` ends exactly those processes and removes
any container they still own (by owner label), so nothing outlives it.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from sandfleet.fleet.local_redis import RedisServer
from sandfleet.worker.sandbox.spec import Owner, process_start_ticks
from sandfleet.worker.scenario import write_reference_data

WORKER_READY_TIMEOUT_S = 60.0
WORKER_STOP_TIMEOUT_S = 60.0
READY_MARK = " ready."  # what Celery logs once a worker consumes


def replay_script(program: str, rules: Sequence[Mapping[str, object]] = ()) -> dict[str, object]:
    """A replay script that answers every request with ``program`` in a python block; ``rules``
    (worker/llm/replay_script.py) go first, e.g. a latency of its own per question."""
    return {"rules": list(rules), "default": [f"```python\n{program.rstrip()}\n```"]}


def replay_model_name(script: Path, latency_s: float) -> str:
    """The ``replay:FILE?latency=S`` model name the worker starts its in-process replay server for."""
    return f"replay:{script}?latency={latency_s:g}"


@dataclass
class FleetConfig:
    """What to start. ``env`` adds ``SANDFLEET_*`` settings for the workers (e.g. POOL_SIZE)."""

    workers: int = 1
    concurrency: int = 16
    sandboxes: int = 4
    tools: str = "sandfleet.worker.tools.examples.orders"
    program: str = ""
    model_latency_s: float = 0.0
    replay_rules: list[dict[str, object]] = field(default_factory=list)  # before the default answer
    env: dict[str, str] = field(default_factory=dict)
    loglevel: str = "warning"


@dataclass
class WorkerProcess:
    name: str
    process: subprocess.Popen[bytes]
    log_path: Path
    log_file: IO[bytes]
    owner_label: str = ""


class LocalFleet:
    """Redis + worker subprocesses in a scratch folder. Use as a context manager; ``start`` waits
    until every worker consumes."""

    def __init__(self, config: FleetConfig, folder: Path | None = None) -> None:
        self.config = config
        self._own_folder = folder is None
        self.folder = Path(folder or tempfile.mkdtemp(prefix="sandfleet-loadtest-"))
        self.token = uuid.uuid4().hex[:8]
        self.redis = RedisServer(self.folder / "redis")
        self.workers: list[WorkerProcess] = []
        self.script_path = self.folder / "replay.json"
        self.data_dir = self.folder / "data"
        self.model = replay_model_name(self.script_path, config.model_latency_s)

    @property
    def redis_url(self) -> str:
        return self.redis.url

    def __enter__(self) -> LocalFleet:
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- starting -----------------------------------------------------------------------------------

    def start(self) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        write_reference_data(self.data_dir)
        self.script_path.write_text(json.dumps(replay_script(self.config.program, self.config.replay_rules)))
        self.redis.start()
        for index in range(self.config.workers):
            self.start_worker(f"lt{index + 1}-{self.token}")
        self.wait_ready()

    def worker_env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("SANDFLEET_")}
        env.update(
            {
                "SANDFLEET_REDIS_URL": self.redis_url,
                "SANDFLEET_DATA_DIR": str(self.data_dir),
                "SANDFLEET_TOOLS": self.config.tools,
                "SANDFLEET_MODEL": self.model,
                "SANDFLEET_MAX_SANDBOXES": str(self.config.sandboxes),
                **self.config.env,
            }
        )
        return env

    def start_worker(self, name: str) -> WorkerProcess:
        log_path = self.folder / f"worker-{name}.log"
        log_file = open(log_path, "ab")  # noqa: SIM115 - closed in stop()
        cmd = [
            sys.executable,
            "-c",
            "from sandfleet.cli import main; main(prog_name='sandfleet')",
            "worker",
            f"--concurrency={self.config.concurrency}",
            f"--sandboxes={self.config.sandboxes}",
            f"--hostname={name}@%h",
            f"--loglevel={self.config.loglevel}",
        ]
        process = subprocess.Popen(
            cmd, env=self.worker_env(), stdout=log_file, stderr=subprocess.STDOUT, start_new_session=True
        )
        worker = WorkerProcess(name, process, log_path, log_file)
        self.workers.append(worker)
        return worker

    def wait_ready(self, timeout_s: float = WORKER_READY_TIMEOUT_S) -> None:
        """Wait until every worker answers a Celery ping (it consumes), and note its owner label.

        Raises:
            RuntimeError: a worker exited or did not answer in time (the end of its log is quoted).
        """
        from sandfleet.core.queue import make_app
        from sandfleet.core.settings import Settings

        app = make_app(Settings(redis_url=self.redis_url))
        deadline = time.monotonic() + timeout_s
        try:
            waiting = {f"{w.name}@{socket.gethostname()}": w for w in self.workers if not w.owner_label}
            while waiting:
                for worker in waiting.values():
                    if worker.process.poll() is not None:
                        raise RuntimeError(
                            f"worker {worker.name} exited with {worker.process.returncode}:\n{self.log_tail(worker)}"
                        )
                replies = app.control.ping(timeout=0.5) or []
                for reply in replies:
                    for hostname in reply:
                        worker = waiting.pop(hostname, None)
                        if worker is not None:
                            pid = worker.process.pid
                            worker.owner_label = Owner(
                                socket.gethostname(), pid, process_start_ticks(pid) or 0
                            ).label()
                if waiting and time.monotonic() > deadline:
                    names = ", ".join(w.name for w in waiting.values())
                    tail = self.log_tail(next(iter(waiting.values())))
                    raise RuntimeError(f"workers not ready after {timeout_s:g} s: {names}\n{tail}")
        finally:
            app.close()

    # -- reading ------------------------------------------------------------------------------------

    def worker_pids(self) -> list[int]:
        return [w.process.pid for w in self.workers if w.process.poll() is None]

    def owner_labels(self) -> set[str]:
        return {w.owner_label for w in self.workers if w.owner_label}

    def log_tail(self, worker: WorkerProcess, chars: int = 2000) -> str:
        worker.log_file.flush()
        return worker.log_path.read_text(errors="replace")[-chars:]

    # -- stopping -----------------------------------------------------------------------------------

    def stop(self) -> None:
        """Stop the workers (warm shutdown: their pools drain), remove what they left, stop Redis."""
        owners = self.owner_labels()
        for worker in self.workers:
            if worker.process.poll() is None:
                worker.process.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + WORKER_STOP_TIMEOUT_S
        for worker in self.workers:
            try:
                worker.process.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                worker.process.kill()
                worker.process.wait()
            worker.log_file.close()
        if owners:
            _remove_containers_of(owners)
        self.redis.stop()
        self.workers = []
        if self._own_folder:
            shutil.rmtree(self.folder, ignore_errors=True)


def _remove_containers_of(owners: set[str]) -> None:
    """Remove containers still labelled with one of ``owners`` (a worker killed mid-run)."""
    try:
        from sandfleet.worker.sandbox.reaper import prune

        prune(owners=owners)
    except Exception as e:  # the engine is gone: nothing of ours can be running on it either
        print(f"loadtest: could not check for leftover containers: {e}", file=sys.stderr)
