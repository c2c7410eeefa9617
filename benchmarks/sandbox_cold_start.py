"""Cold sandbox start, one command and removal, under runc and runsc, beside the raw Docker SDK.

    .venv/bin/python benchmarks/sandbox_cold_start.py [--runs 30] [--runtimes runc,runsc] [--json]

Per runtime and run, timed with time.perf_counter on the host:
  start     DockerBackend.start: create, attach, start, send the agent, wait for its hello
  execute   SandboxContainer.execute(["python3", "-c", "pass"]) in that container
  destroy   SandboxContainer.destroy: kill and remove it
  total     the three together, end to end
and, in the same run and interleaved with the above so that drift hits both alike:
  raw run   docker.DockerClient.containers.run(image, "python3 -c pass", remove=True) with the same
            hardening settings (spec.container_kwargs), end to end.
Prints median and p95 (ms) and the ratio total / raw run. One warm-up round per runtime is not
counted. Figures drift between runs and hosts: compare the ratios measured side by side.
Every container carries the label ``sandfleet.benchmark=cold-start`` and is removed.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from sandfleet.core.config import SandboxConfig

BACKEND_OF = {"runc": "docker", "runsc": "gvisor"}  # Docker runtime -> SandboxConfig backend
LABELS = {"sandfleet.benchmark": "cold-start"}
COMMAND = ["python3", "-c", "pass"]
PHASES = ("start", "execute", "destroy", "total", "raw run")
# container_kwargs keys that belong to the agent's way of running, not to the hardening.
NOT_HARDENING = ("command", "stdin_open", "detach", "tty")


def summary_ms(samples_s: Sequence[float]) -> dict[str, float]:
    ms = sorted(s * 1000 for s in samples_s)
    p95 = statistics.quantiles(ms, n=20, method="inclusive")[18] if len(ms) >= 2 else ms[0]
    return {"n": len(ms), "median": statistics.median(ms), "p95": p95, "min": ms[0], "max": ms[-1]}


def one_sandbox(config: SandboxConfig, client: Any) -> dict[str, float]:
    from sandfleet.worker.sandbox.docker.backend import DockerBackend

    began = time.perf_counter()
    container = DockerBackend(client).start(config, labels=LABELS)
    try:
        started = time.perf_counter()
        result = container.execute(COMMAND, timeout=30)
        executed = time.perf_counter()
        if result.exit_code != 0:
            raise SystemExit(f"python3 -c pass failed in the sandbox: {result.stderr}")
    finally:
        container.destroy()
    destroyed = time.perf_counter()
    return {
        "start": started - began,
        "execute": executed - started,
        "destroy": destroyed - executed,
        "total": destroyed - began,
    }


def raw_kwargs(config: SandboxConfig, client: Any) -> dict[str, Any]:
    """The same hardening as a sandbox, for a plain ``containers.run``."""
    from sandfleet.worker.sandbox.docker.spec import Owner, container_kwargs

    ncpu = int(client.info().get("NCPU", 1))
    kwargs = container_kwargs(config, owner=Owner.current(), host_ncpu=ncpu, labels=LABELS)
    for key in NOT_HARDENING:
        kwargs.pop(key)
    kwargs["log_config"] = {"type": "json-file", "config": {}}  # containers.run reads the output there
    return kwargs


def one_raw_run(kwargs: dict[str, Any], client: Any) -> float:
    began = time.perf_counter()
    client.containers.run(command=COMMAND, remove=True, **kwargs)
    return time.perf_counter() - began


def measure(runtime: str, runs: int, client: Any) -> dict[str, dict[str, float]]:
    config = SandboxConfig(backend=BACKEND_OF[runtime])  # type: ignore[arg-type]
    kwargs = raw_kwargs(config, client)
    one_sandbox(config, client)  # warm-up: image layers, runtime binaries and the agent in the page cache
    one_raw_run(kwargs, client)
    samples: dict[str, list[float]] = {phase: [] for phase in PHASES}
    for _ in range(runs):
        for phase, seconds in one_sandbox(config, client).items():
            samples[phase].append(seconds)
        samples["raw run"].append(one_raw_run(kwargs, client))
        print(".", end="", file=sys.stderr, flush=True)
    print(file=sys.stderr)
    return {phase: summary_ms(values) for phase, values in samples.items()}


def remove_leftovers(client: Any) -> None:
    """After an interruption: remove this benchmark's containers (and only those)."""
    wanted = [f"{k}={v}" for k, v in LABELS.items()]
    for found in client.api.containers(all=True, filters={"label": wanted}):
        try:
            client.api.remove_container(found["Id"], force=True)
        except Exception as e:
            print(f"could not remove {found['Id'][:12]}: {e}", file=sys.stderr)


def print_table(results: dict[str, dict[str, dict[str, float]]], runs: int) -> None:
    print(f"Sandbox cold start: median / p95 in ms over {runs} runs (python3 -c pass)")
    print(f"{'':12}" + "".join(f"{runtime:>22}" for runtime in results))
    for phase in PHASES:
        cells = "".join(f"{s[phase]['median']:>12.1f} / {s[phase]['p95']:>7.1f}" for s in results.values())
        print(f"{phase:12}{cells}")
    ratios = "".join(
        f"{s['total']['median'] / s['raw run']['median']:>12.2f} / {s['total']['p95'] / s['raw run']['p95']:>7.2f}"
        for s in results.values()
    )
    print(f"{'total / raw':12}{ratios}")
    if "runc" in results and "runsc" in results:
        total = results["runsc"]["total"]["median"] / results["runc"]["total"]["median"]
        raw = results["runsc"]["raw run"]["median"] / results["runc"]["raw run"]["median"]
        print(f"runsc / runc, median: sandbox total {total:.2f}x, raw run {raw:.2f}x")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=30, help="timed runs per runtime (default 30)")
    parser.add_argument("--runtimes", default="runc,runsc", help="comma-separated Docker runtimes")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON instead of a table")
    args = parser.parse_args()

    from sandfleet.worker.sandbox.docker.backend import docker_client, engine_info

    client = docker_client()
    info = engine_info(client)
    runtimes = [r for r in args.runtimes.split(",") if r]
    missing = [r for r in runtimes if r not in info.runtimes]
    if missing:
        raise SystemExit(f"runtime(s) not registered with the engine: {', '.join(missing)}")
    results: dict[str, dict[str, dict[str, float]]] = {}
    try:
        for runtime in runtimes:
            print(f"{runtime}: {args.runs} runs", file=sys.stderr)
            results[runtime] = measure(runtime, args.runs, client)
    finally:
        remove_leftovers(client)
    if args.json:
        print(
            json.dumps(
                {"runs": args.runs, "docker": info.server_version, "ncpu": info.ncpu, "results_ms": results},
                indent=2,
            )
        )
    else:
        print(f"Docker {info.server_version}, {info.ncpu} CPUs, cgroup v{info.cgroup_version}")
        print_table(results, args.runs)


if __name__ == "__main__":
    main()
