"""A local fleet: ``sandfleet worker`` processes on one Redis, started here and stopped here.

The one helper behind ``sandfleet loadtest --local``, ``sandfleet demo``, the benchmarks and the
tests that need real workers. It owns, in a scratch folder: a ``redis-server`` on a free loopback
port (no persistence) unless it is given a Redis to use, the reference data, the folder of replay
scripts its workers accept from jobs (``scripts/``, their SANDFLEET_REPLAY_SCRIPTS_DIR) holding its
replay model script whose every answer is one program, and the worker subprocesses, each in a process
group of its own (so a signal reaches exactly that worker). :meth:`LocalFleet.stop` ends exactly
those processes and removes any container they still own (by owner label), so nothing outlives it.
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

from sandfleet.core.console import echo
from sandfleet.core.settings import Settings
from sandfleet.fleet.local_redis import RedisServer, free_port
from sandfleet.producer.client import Client
from sandfleet.worker.sandbox.docker.spec import Owner, process_start_ticks
from sandfleet.worker.tools.examples.scenario import write_reference_data

WORKER_READY_TIMEOUT_S = 60.0
WORKER_STOP_TIMEOUT_S = 60.0
# The CLI in this interpreter (works from a venv without its bin/ on PATH).
SANDFLEET_ARGV = [sys.executable, "-c", "from sandfleet.cli import main; main(prog_name='sandfleet')"]


def replay_script(program: str, rules: Sequence[Mapping[str, object]] = ()) -> dict[str, object]:
    """A replay script that answers every request with ``program`` in a python block; ``rules``
    (sandfleet/worker/llm/scripted/script.py) go first, e.g. a latency of its own per question."""
    return {"rules": list(rules), "default": [f"```python\n{program.rstrip()}\n```"]}


def replay_model_name(script: Path, latency_s: float) -> str:
    """The ``replay:FILE?latency=S`` model name the worker starts its in-process replay server for."""
    return f"replay:{script}?latency={latency_s:g}"


@dataclass
class FleetConfig:
    """What to start and how.

    Attributes:
        workers: workers :meth:`LocalFleet.start` starts (more can be added with ``start_worker``).
        concurrency, sandboxes: each worker's jobs in flight and live containers.
        tools: the workers' ``SANDFLEET_TOOLS``.
        program: what the fleet's replay model (its workers' default model) answers every question with.
        replay_scripts_dir: the workers' SANDFLEET_REPLAY_SCRIPTS_DIR, the folder whose scripts a
            job's ``replay:FILE`` model may name; None: ``scripts/`` in the fleet's folder. The fleet's
            own script is written there; so should a test's (``LocalFleet.scripts_dir``).
        env: more ``SANDFLEET_*`` settings for the workers (e.g. ``SANDFLEET_POOL_SIZE``).
        inherit_settings: pass this process's ``SANDFLEET_*`` variables on (the demo: the user's
            model endpoint); otherwise workers see only what the fleet sets.
    """

    workers: int = 1
    concurrency: int = 16
    sandboxes: int = 4
    tools: str = "sandfleet.worker.tools.examples.orders"
    program: str = ""
    model_latency_s: float = 0.0
    replay_rules: list[dict[str, object]] = field(default_factory=list)  # before the default answer
    replay_scripts_dir: Path | None = None
    env: dict[str, str] = field(default_factory=dict)
    loglevel: str = "warning"
    inherit_settings: bool = False
    metrics: bool = False  # each worker serves Prometheus metrics on a free port (WorkerProcess.metrics_url)


@dataclass
class WorkerProcess:
    """One ``sandfleet worker`` subprocess. ``name`` is its Celery hostname (``name@host``)."""

    name: str
    process: subprocess.Popen[bytes]
    log_path: Path
    log_file: IO[bytes]
    owner_label: str = ""
    metrics_url: str | None = None  # with FleetConfig.metrics: its /metrics endpoint

    def alive(self) -> bool:
        return self.process.poll() is None

    def log(self) -> str:
        if not self.log_file.closed:  # still running: what it wrote so far
            self.log_file.flush()
        return self.log_path.read_text(errors="replace")

    def log_tail(self, chars: int = 2000) -> str:
        return self.log()[-chars:]


class LocalFleet:
    """Workers (and, unless given one, a Redis) in a scratch folder. Use as a context manager.

    Args:
        config: what to start.
        folder: the scratch folder (a new temporary one, removed on stop, when None).
        redis_url: a Redis to use (it is neither started nor stopped here); None: start one.
        key_prefix: the fleet's key prefix (a fresh one keeps fleets on one Redis apart).
    """

    def __init__(
        self,
        config: FleetConfig | None = None,
        folder: Path | None = None,
        *,
        redis_url: str | None = None,
        key_prefix: str = "sandfleet",
    ) -> None:
        self.config = config or FleetConfig()
        self._own_folder = folder is None
        self.folder = Path(folder or tempfile.mkdtemp(prefix="sandfleet-fleet-"))
        self.token = uuid.uuid4().hex[:8]
        self.redis = None if redis_url else RedisServer(self.folder / "redis")
        self._redis_url = redis_url
        self.key_prefix = key_prefix
        self.workers: list[WorkerProcess] = []
        self.scripts_dir = self.config.replay_scripts_dir or self.folder / "scripts"
        self.script_path = self.scripts_dir / "replay.json"
        self.data_dir = self.folder / "data"
        self.model = replay_model_name(self.script_path, self.config.model_latency_s)

    @property
    def redis_url(self) -> str:
        return self._redis_url or (self.redis.url if self.redis else "")

    @property
    def settings(self) -> Settings:
        """Settings of a producer (or reader) of this fleet."""
        return Settings(redis_url=self.redis_url, key_prefix=self.key_prefix)

    def client(self) -> Client:
        return Client(settings=self.settings)

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
        """Redis (if it is ours), the data, the model script, ``config.workers`` workers; waits until
        every worker consumes."""
        self.prepare()
        for _ in range(self.config.workers):
            self.start_worker(wait=False)
        self.wait_ready()

    def prepare(self) -> None:
        """The folder, the reference data, the replay script and our Redis (each once)."""
        self.folder.mkdir(parents=True, exist_ok=True)
        self.scripts_dir.mkdir(parents=True, exist_ok=True)
        if not self.data_dir.exists():
            write_reference_data(self.data_dir)
        if not self.script_path.exists():
            self.script_path.write_text(
                json.dumps(replay_script(self.config.program, self.config.replay_rules))
            )
        if self.redis is not None and not self.redis.running:
            self.redis.start()

    def worker_env(self, **extra: str) -> dict[str, str]:
        inherit = self.config.inherit_settings
        env = {k: v for k, v in os.environ.items() if inherit or not k.startswith("SANDFLEET_")}
        env.update(
            {
                "SANDFLEET_REDIS_URL": self.redis_url,
                "SANDFLEET_KEY_PREFIX": self.key_prefix,
                "SANDFLEET_DATA_DIR": str(self.data_dir),
                "SANDFLEET_TOOLS": self.config.tools,
                "SANDFLEET_MAX_SANDBOXES": str(self.config.sandboxes),
                "SANDFLEET_WORKER_STATE_DIR": str(self.folder / "worker-state"),  # its signing keys
                "SANDFLEET_REPLAY_SCRIPTS_DIR": str(self.scripts_dir),
            }
        )
        env["SANDFLEET_MODEL"] = self.model  # config.env may name another model
        env.update(self.config.env)
        env.update(extra)
        return env

    def worker_command(self, name: str, concurrency: int, sandboxes: int) -> list[str]:
        """The ``sandfleet worker`` command line (a multi-host fleet puts its launcher in front)."""
        return [
            *SANDFLEET_ARGV,
            "worker",
            f"--concurrency={concurrency}",
            f"--sandboxes={sandboxes}",
            f"--hostname={name}@{socket.gethostname()}",
            f"--loglevel={self.config.loglevel}",
        ]

    def start_worker(
        self,
        name: str | None = None,
        *,
        concurrency: int | None = None,
        sandboxes: int | None = None,
        env: dict[str, str] | None = None,
        wait: bool = True,
    ) -> WorkerProcess:
        """One more worker (named ``name@host``; a fresh name when None); ``wait``: until it consumes."""
        self.prepare()
        name = name or f"w{len(self.workers) + 1}-{self.token}"
        log_path = self.folder / f"worker-{name}.log"
        log_file = open(log_path, "ab")  # noqa: SIM115 - closed in stop()
        cmd = self.worker_command(
            name, concurrency or self.config.concurrency, sandboxes or self.config.sandboxes
        )
        extra = dict(env or {})
        metrics_url = None
        if self.config.metrics and "SANDFLEET_METRICS_PORT" not in extra:
            port = free_port()
            extra["SANDFLEET_METRICS_PORT"] = str(port)
            metrics_url = f"http://127.0.0.1:{port}/metrics"
        process = subprocess.Popen(
            cmd,
            env=self.worker_env(**extra),
            stdout=log_file,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        worker = WorkerProcess(
            f"{name}@{socket.gethostname()}", process, log_path, log_file, metrics_url=metrics_url
        )
        self.workers.append(worker)
        if wait:
            self.wait_ready([worker])
        return worker

    def wait_ready(
        self, workers: list[WorkerProcess] | None = None, timeout_s: float = WORKER_READY_TIMEOUT_S
    ) -> None:
        """Wait until the workers answer a Celery ping (they consume), and note their owner labels.

        Raises:
            RuntimeError: a worker exited or did not answer in time (the end of its log is quoted).
        """
        from sandfleet.core.queue import make_app

        app = make_app(self.settings)
        deadline = time.monotonic() + timeout_s
        try:
            waiting = {w.name: w for w in (workers or self.workers) if not w.owner_label}
            while waiting:
                for worker in waiting.values():
                    if not worker.alive():
                        raise RuntimeError(
                            f"worker {worker.name} exited with {worker.process.returncode}:\n{worker.log_tail()}"
                        )
                for reply in app.control.ping(timeout=0.5) or []:
                    for hostname in reply:
                        ready = waiting.pop(hostname, None)
                        if ready is not None:
                            pid = ready.process.pid
                            ticks = process_start_ticks(pid) or 0
                            ready.owner_label = Owner(socket.gethostname(), pid, ticks).label()
                if waiting and time.monotonic() > deadline:
                    names = ", ".join(waiting)
                    tail = next(iter(waiting.values())).log_tail()
                    raise RuntimeError(f"workers not ready after {timeout_s:g} s: {names}\n{tail}")
        finally:
            app.close()

    # -- reading ------------------------------------------------------------------------------------

    def by_name(self, name: str) -> WorkerProcess | None:
        return next((w for w in self.workers if w.name == name), None)

    def worker_pids(self) -> list[int]:
        return [w.process.pid for w in self.workers if w.alive()]

    def owner_labels(self) -> set[str]:
        return {w.owner_label for w in self.workers if w.owner_label}

    # -- stopping -----------------------------------------------------------------------------------

    def kill(self, worker: WorkerProcess, sig: int = signal.SIGKILL) -> None:
        """Signal exactly that worker (kill -9 by default: it dies holding what it held)."""
        os.kill(worker.process.pid, sig)

    def stop(self) -> None:
        """Stop the workers (warm shutdown: their pools drain), remove what they left, stop our Redis."""
        owners = self.owner_labels()
        for worker in self.workers:
            if worker.alive():
                worker.process.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + WORKER_STOP_TIMEOUT_S
        for worker in self.workers:
            try:
                worker.process.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                os.killpg(worker.process.pid, signal.SIGKILL)
                worker.process.wait()
            worker.log_file.close()
        if owners:
            _remove_containers_of(owners)
        if self.redis is not None:
            self.redis.stop()
        self.workers = []
        if self._own_folder:
            shutil.rmtree(self.folder, ignore_errors=True)


def _remove_containers_of(owners: set[str]) -> None:
    """Remove containers still labelled with one of ``owners`` (a worker killed mid-run)."""
    try:
        from sandfleet.worker.sandbox.docker.reaper import prune

        prune(owners=owners)
    except Exception as e:  # the engine is gone: nothing of ours can be running on it either
        echo(f"local fleet: could not check for leftover containers: {e}", err=True)
