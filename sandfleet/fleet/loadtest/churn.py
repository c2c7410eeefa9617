"""Raw container churn: the physical limit of one fresh container per job on this host.

``concurrency`` threads each loop ``docker run --rm`` (the SDK's ``containers.run(remove=True)``:
create, start, wait, read the logs, remove) of the sandbox image with the sandbox's own hardening
(the kwargs :func:`sandfleet.worker.sandbox.docker.spec.container_kwargs` builds), running ``python3 -c`` of a trivial
program instead of the agent. The benchmarks compare the fleet against this, measured in the same run.

Two recipes for "no network" (issue 12): ``"disabled"``, the sandbox's own (``network_disabled``,
the cheapest, equally isolated: spec.py), and ``"none"``, the engine's "none" network
(``network_mode="none"``), the recipe the fleet was measured against before. Either way the run
keeps a json-file log, from which ``containers.run`` reads the output it checks.

The containers carry ``sandfleet.role=bench`` and this process as owner, so ``sandfleet sandbox
prune`` finds any that a killed run left; :func:`measure_churn` removes its own in ``finally``.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from sandfleet.core.config import SandboxConfig
from sandfleet.fleet.loadtest.stats import summarize
from sandfleet.worker.sandbox.docker import backend as engine
from sandfleet.worker.sandbox.docker.spec import Owner, container_kwargs

TRIVIAL_PROGRAM = 'print("RESULT: 1")'
LABEL_BENCH = "sandfleet.bench"


@dataclass(frozen=True)
class ChurnResult:
    runs: int
    failures: int
    concurrency: int
    runtime: str
    wall_s: float
    per_run_s: dict[str, Any]

    @property
    def jobs_per_s(self) -> float:
        return self.runs / self.wall_s if self.wall_s > 0 else 0.0


NETWORK_RECIPES = ("disabled", "none")


def churn_kwargs(
    config: SandboxConfig, run_label: str, host_ncpu: int, program: str, network: str = "disabled"
) -> dict[str, Any]:
    """``containers.run`` kwargs: the sandbox's hardening, a one-shot ``python3 -c program``, its
    output logged, no network by the ``network`` recipe (NETWORK_RECIPES)."""
    if network not in NETWORK_RECIPES:
        raise ValueError(f"network recipe must be one of {NETWORK_RECIPES}, got {network!r}")
    kwargs = container_kwargs(config, owner=Owner.current(), host_ncpu=host_ncpu)
    kwargs["labels"] = {**kwargs["labels"], engine.LABEL_ROLE: "bench", LABEL_BENCH: run_label}
    kwargs.update(command=["python3", "-c", program], stdin_open=False, detach=False, remove=True)
    kwargs["log_config"] = {"type": "json-file", "config": {}}
    if network == "none" and config.network == "none":
        kwargs.pop("network_disabled", None)
        kwargs["network_mode"] = "none"
    return kwargs


def run_concurrently(count: int, threads: int, one: Callable[[], None]) -> None:
    """Call ``one`` ``count`` times from ``threads`` threads, each taking the next call when free."""
    left, lock = [count], threading.Lock()

    def loop() -> None:
        while True:
            with lock:
                if left[0] <= 0:
                    return
                left[0] -= 1
            one()

    workers = [threading.Thread(target=loop, daemon=True) for _ in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()


def remove_bench_containers(client: Any, label: str) -> None:
    """Remove what a churn run labelled ``label`` left (a run interrupted before its remove)."""
    for leftover in client.containers.list(all=True, filters={"label": f"{LABEL_BENCH}={label}"}):
        try:
            leftover.remove(force=True)
        except Exception:  # gone meanwhile, or the engine is: nothing left to do
            pass


def measure_churn(
    runs: int,
    concurrency: int,
    config: SandboxConfig | None = None,
    program: str = TRIVIAL_PROGRAM,
    network: str = "disabled",
) -> ChurnResult:
    """Run ``runs`` fresh containers, ``concurrency`` at a time; wall time and per-run latency."""
    config = config or SandboxConfig()
    client = engine.docker_client()
    info = engine.engine_info(client)
    label = uuid.uuid4().hex[:12]
    kwargs = churn_kwargs(config, label, info.ncpu, program, network)
    lock = threading.Lock()
    latencies: list[float] = []
    failures = [0]

    def one() -> None:
        began = time.perf_counter()
        try:
            ok = b"RESULT: 1" in client.containers.run(**kwargs)
        except Exception:
            ok = False
        with lock:
            latencies.append(time.perf_counter() - began)
            failures[0] += 0 if ok else 1

    began = time.perf_counter()
    try:
        run_concurrently(runs, concurrency, one)
    finally:
        wall = time.perf_counter() - began
        remove_bench_containers(client, label)
    return ChurnResult(runs, failures[0], concurrency, config.docker_runtime, wall, summarize(latencies))
