"""What each container-creation option costs: every option A/B'd against the sandbox without it, in one run.

    .venv/bin/python benchmarks/container_options.py [--cycles 20] [--runtimes runc,runsc]

The baseline is a sandbox container exactly as sandfleet/worker/sandbox/docker/spec.py asks for it (container_kwargs),
run one-shot: create, start, wait, remove, of ``python3 -c pass`` (no agent, nothing attached). Each
variant changes one thing: drops one option (tmpfs mounts, ulimits, no-new-privileges, the cgroup
limits, read-only root, cap-drop, IPC mode, hostname), adds one (docker-init as PID 1, where the
agent is PID 1 now), or swaps it (the engine's "none" network instead of a disabled one, Docker's
json-file log, Docker's seccomp profile off, the one-layer base image, /bin/true instead of Python,
the real agent's boot and hello); two more write
20 MiB to stdout, with and without a log. Each cycle runs one container of every variant, in an
order rotated per cycle, so that the drift of a shared host hits all alike; the delta is paired:
each variant's container against the baseline's of the same cycle, median and quartiles over the
cycles, so its spread shows.

Each row says what the option is for: "kept" options are isolation and stay whatever they cost;
"measured" ones weaken isolation and are there only to show their price. Containers carry
``sandfleet.role=bench`` and this process as owner (``sandfleet sandbox prune`` finds leftovers).
Figures are printed, never asserted.

Measured 2026-12-01, ``--cycles 25``, on a host shared with other engineers (load 9.0 -> 2.9):
baseline 150 ms (runc) / 316 ms (runsc); the engine's "none" network +108 / +100 ms (hence
``network_disabled``); 20 MiB of output logged by json-file +473 ms under runc against +43 without
a log (hence log driver none); Docker's seccomp profile off -25 / -16 (kept on); every other option
within the noise (deploy/SCALING.md has the table).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import RUNTIMES

from sandfleet.core.config import SandboxConfig
from sandfleet.worker.images.build import BASE_TAG
from sandfleet.worker.sandbox.docker import backend as engine
from sandfleet.worker.sandbox.docker.spec import Owner, container_kwargs

LABEL_RUN = "sandfleet.bench"
ONE_SHOT = ["python3", "-c", "pass"]
BIG_OUTPUT = ["python3", "-c", "import os\nfor _ in range(20): os.write(1, bytes(1 << 20))"]
Kwargs = dict[str, Any]


@dataclass(frozen=True)
class Variant:
    """One change to the sandbox's creation options, and what it would mean for isolation."""

    name: str
    change: Callable[[Kwargs], Kwargs]
    meaning: str  # "baseline", "kept: <why>", "measured: <what it would weaken>", "candidate: ..."
    agent: bool = False  # run through SandboxContainer (attach, agent, hello) instead of one-shot


def without(*keys: str) -> Callable[[Kwargs], Kwargs]:
    return lambda k: {key: value for key, value in k.items() if key not in keys}


def replaced(**changes: Any) -> Callable[[Kwargs], Kwargs]:
    return lambda k: {**k, **changes}


def network_none(k: Kwargs) -> Kwargs:
    return {**without("network_disabled")(k), "network_mode": "none"}


def two_tmpfs(k: Kwargs) -> Kwargs:
    return {**k, "tmpfs": {path: opts for path, opts in k["tmpfs"].items() if path != "/var/tmp"}}


VARIANTS = (
    Variant("baseline (spec.container_kwargs)", lambda k: k, "baseline"),
    Variant("network: engine's 'none' network", network_none, "the former recipe: same isolation"),
    Variant(
        "log driver json-file (Docker's default)",
        replaced(log_config={"type": "json-file", "config": {}}),
        "the former setting: nobody reads the logs",
    ),
    Variant("20 MiB to stdout, no log", replaced(command=BIG_OUTPUT), "what the agent's stream costs"),
    Variant(
        "20 MiB to stdout, json-file log",
        replaced(command=BIG_OUTPUT, log_config={"type": "json-file", "config": {}}),
        "the same, logged to the host's disk",
    ),
    Variant("docker-init as PID 1", replaced(init=True), "the former setting: the agent is PID 1 now"),
    Variant("tmpfs: without /var/tmp", two_tmpfs, "candidate: /var/tmp read-only"),
    Variant("tmpfs: none at all", without("tmpfs"), "kept: the only writable places"),
    Variant("no ulimits", without("ulimits"), "kept: nofile, core, nproc (gVisor)"),
    Variant("no hostname", without("hostname"), "candidate: the container id as host name"),
    Variant("IPC mode: engine default", without("ipc_mode"), "kept: private IPC namespace stated"),
    Variant("image: one-layer base", replaced(image=BASE_TAG), "image layers (no sandbox user)"),
    Variant(
        "no cgroup limits",
        without("mem_limit", "memswap_limit", "nano_cpus", "pids_limit"),
        "measured: no memory/CPU/pids limits",
    ),
    Variant("no no-new-privileges", without("security_opt"), "measured: setuid would raise privileges"),
    Variant(
        "seccomp: Docker's profile off",
        replaced(security_opt=["no-new-privileges:true", "seccomp=unconfined"]),
        "measured: one filter fewer",
    ),
    Variant("no cap-drop", without("cap_drop"), "measured: Docker's default capabilities"),
    Variant("writable root", replaced(read_only=False), "measured: a writable image root"),
    Variant("command /bin/true (no Python)", replaced(command=["/bin/true"]), "what Python's start costs"),
    Variant("the agent: start, hello, remove", lambda k: k, "what a real sandbox adds", agent=True),
)


def one_shot(client: Any, kwargs: Kwargs) -> float:
    """Create, start, wait and remove one container; seconds, end to end."""
    began = time.perf_counter()
    container_id = engine.create_container(client, kwargs)
    try:
        client.api.start(container_id)
        status = client.api.wait(container_id, timeout=60)
        if status.get("StatusCode") != 0:
            raise SystemExit(f"{kwargs['command']} exited {status}: {client.api.logs(container_id)[-500:]!r}")
    finally:
        client.api.remove_container(container_id, force=True)
    return time.perf_counter() - began


def with_agent(client: Any, config: SandboxConfig, labels: dict[str, str]) -> float:
    """A real sandbox: start (create, attach, start, agent, hello) and destroy; seconds."""
    began = time.perf_counter()
    engine.DockerBackend(client).start(config, labels=labels).destroy()
    return time.perf_counter() - began


def profile(runtime: str, cycles: int) -> None:
    client = engine.docker_client()
    info = engine.engine_info(client)
    config = SandboxConfig(backend=RUNTIMES[runtime])  # type: ignore[arg-type]
    run_label = uuid.uuid4().hex[:12]
    labels = {engine.LABEL_ROLE: "bench", LABEL_RUN: run_label}
    base = container_kwargs(config, owner=Owner.current(), host_ncpu=info.ncpu)
    base = {**base, "command": ONE_SHOT, "stdin_open": False, "labels": {**base["labels"], **labels}}
    samples: dict[str, list[float]] = {v.name: [] for v in VARIANTS}
    load_before = os.getloadavg()[0]
    try:
        for variant in VARIANTS:  # warm-up: one of each, not counted (image pages, engine caches)
            measure(client, config, variant, base, labels)
        for number in range(cycles):  # one container of each variant per cycle, order rotated
            shift = number % len(VARIANTS)
            for variant in VARIANTS[shift:] + VARIANTS[:shift]:
                samples[variant.name].append(measure(client, config, variant, base, labels))
    finally:
        leftovers = client.api.containers(all=True, filters={"label": f"{LABEL_RUN}={run_label}"})
        for leftover in leftovers:
            client.api.remove_container(leftover["Id"], force=True)
    baseline = samples[VARIANTS[0].name]
    print(
        f"\n{runtime}: {cycles} cycles, one container of each variant per cycle; ms per container "
        f"(load average {load_before:.1f} before, {os.getloadavg()[0]:.1f} after, on {os.cpu_count()} cores)"
    )
    print(f"  {'variant':<38}{'median':>8}{'p95':>8}{'delta':>8}{'p25..p75':>14}  meaning")
    for variant in VARIANTS:
        ms = sorted(t * 1000 for t in samples[variant.name])
        p95 = statistics.quantiles(ms, n=20)[18] if len(ms) >= 2 else ms[0]
        # paired: each cycle's container against the baseline's of the same cycle
        deltas = [(t - b) * 1000 for t, b in zip(samples[variant.name], baseline, strict=True)]
        quartiles = statistics.quantiles(deltas, n=4) if len(deltas) >= 2 else [deltas[0]] * 3
        delta, spread = (
            ("", "")
            if variant is VARIANTS[0]
            else (f"{statistics.median(deltas):+.0f}", f"{quartiles[0]:+.0f}..{quartiles[2]:+.0f}")
        )
        print(
            f"  {variant.name:<38}{statistics.median(ms):>8.0f}{p95:>8.0f}{delta:>8}{spread:>14}  {variant.meaning}"
        )


def measure(
    client: Any, config: SandboxConfig, variant: Variant, base: Kwargs, labels: dict[str, str]
) -> float:
    if variant.agent:
        return with_agent(client, config, labels)
    return one_shot(client, variant.change(base))


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--cycles", type=int, default=20, help="containers per variant")
    parser.add_argument("--runtimes", default="runc,runsc")
    args = parser.parse_args()
    registered = set(engine.engine_info().runtimes)
    for runtime in args.runtimes.split(","):
        if runtime not in registered:
            print(f"\n{runtime}: not registered with the engine; skipped")
            continue
        profile(runtime, args.cycles)


if __name__ == "__main__":
    main()
