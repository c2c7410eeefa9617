"""The sandbox's container under each OCI runtime the engine has: create, start, wait, remove, in one run.

    .venv/bin/python benchmarks/oci_runtimes.py [--cycles 30] [--runtimes runc,crun,runsc]

Issue 25 point 2: is Debian's crun a faster runtime for the runc class? Each runtime gets the
container spec.py asks for (container_kwargs; gVisor's own for runsc), running ``python3 -c pass``
one-shot: the engine's and the runtime's cost of one fresh sandbox, without the agent. Each cycle
runs one container per runtime, in an order rotated per cycle, so the drift of a shared host hits
all alike; the ratio to runc is paired (each cycle's container against runc's of the same cycle),
median and quartiles over the cycles. A runtime the engine lacks, or that cannot start the
container on this host, is named with the engine's reason and left out.

Before any timing, each runtime's isolation as the program sees it (docker/probe.py: identity,
capabilities, no-new-privileges, seccomp and refused syscalls, writable places, cgroup limits,
interfaces, mounts with their flags) is compared with runc's under the same options, and every
difference printed: a faster runtime that isolates differently is no candidate for the default.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from container_options import ONE_SHOT, one_shot

from sandfleet.core.config import SandboxConfig
from sandfleet.worker.sandbox.docker import backend as engine
from sandfleet.worker.sandbox.docker.probe import isolation_view, view_differences
from sandfleet.worker.sandbox.docker.spec import Owner, container_kwargs

LABEL_RUN = "sandfleet.bench"


def kwargs_for(runtime: str, ncpu: int, labels: dict[str, str]) -> dict[str, Any]:
    """The sandbox's creation options under ``runtime`` (runsc: gVisor's own; others: the runc class's)."""
    config = SandboxConfig(backend="gvisor" if runtime.startswith("runsc") else "docker")
    base = container_kwargs(config, owner=Owner.current(), host_ncpu=ncpu)
    return {
        **base,
        "runtime": runtime,
        "command": ONE_SHOT,
        "stdin_open": False,
        "labels": {**base["labels"], **labels},
    }


def usable(client: Any, runtime: str, kwargs: dict[str, Any]) -> str | None:
    """None when one container runs under ``runtime`` (a warm-up, not counted); else why not."""
    try:
        one_shot(client, kwargs)
    except engine.DockerError as e:
        return str(getattr(e, "explanation", None) or e)
    return None


def compare_isolation(client: Any, chosen: dict[str, dict[str, Any]]) -> None:
    """Print, for each runtime of the runc class beside runc, how its view differs from runc's."""
    if "runc" not in chosen:
        return
    reference = isolation_view(client, chosen["runc"])
    for runtime, kwargs in chosen.items():
        if runtime == "runc" or runtime.startswith("runsc"):  # gVisor's kernel answers differently by design
            continue
        differing = view_differences(reference, isolation_view(client, kwargs))
        print(
            f"{runtime}: isolation seen from inside, against runc's under the same options: "
            + ("the same" if not differing else f"{len(differing)} aspect(s) differ")
        )
        for aspect, (runc_has, other_has) in differing.items():
            print(f"    {aspect}: runc {runc_has}\n    {' ' * len(aspect)}  {runtime} {other_has}")


def quartiles(values: list[float]) -> tuple[float, float, float]:
    if len(values) < 2:
        return values[0], values[0], values[0]
    q1, q2, q3 = statistics.quantiles(values, n=4)
    return q1, q2, q3


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--cycles", type=int, default=30, help="containers per runtime")
    parser.add_argument("--runtimes", default="runc,crun,runsc")
    args = parser.parse_args()

    client = engine.docker_client()
    info = engine.engine_info(client)
    run_label = uuid.uuid4().hex[:12]
    labels = {engine.LABEL_ROLE: "bench", LABEL_RUN: run_label}
    chosen: dict[str, dict[str, Any]] = {}
    try:
        for runtime in [r.strip() for r in args.runtimes.split(",") if r.strip()]:
            if runtime not in info.runtimes:
                print(f"{runtime}: not registered with the engine; left out")
                continue
            kwargs = kwargs_for(runtime, info.ncpu, labels)
            if (why := usable(client, runtime, kwargs)) is not None:
                print(f"{runtime}: cannot start the sandbox's container on this host; left out:\n    {why}")
                continue
            chosen[runtime] = kwargs
        compare_isolation(client, chosen)
        samples: dict[str, list[float]] = {runtime: [] for runtime in chosen}
        names = list(chosen)
        load_before = os.getloadavg()[0]
        for number in range(args.cycles):
            shift = number % max(1, len(names))
            for runtime in names[shift:] + names[:shift]:
                samples[runtime].append(one_shot(client, chosen[runtime]))
    finally:
        for leftover in client.api.containers(all=True, filters={"label": f"{LABEL_RUN}={run_label}"}):
            client.api.remove_container(leftover["Id"], force=True)
    if not samples:
        raise SystemExit("no runtime could start the sandbox's container")
    print(
        f"\n{args.cycles} cycles, one container per runtime each (create, start, wait, remove of "
        f"{' '.join(ONE_SHOT)}); load average {load_before:.1f} before, {os.getloadavg()[0]:.1f} after, "
        f"{os.cpu_count()} cores"
    )
    print(f"  {'runtime':<10}{'median':>9}{'p25..p75 ms':>16}{'/ runc':>9}{'p25..p75':>14}")
    baseline = samples.get("runc")
    for runtime, times in samples.items():
        ms = [t * 1000 for t in times]
        q1, q2, q3 = quartiles(ms)
        ratio, spread = "", ""
        if baseline is not None and runtime != "runc":
            paired = [t / b for t, b in zip(times, baseline, strict=True)]
            r1, r2, r3 = quartiles(paired)
            ratio, spread = f"{r2:.2f}", f"{r1:.2f}..{r3:.2f}"
        print(f"  {runtime:<10}{q2:>9.0f}{f'{q1:.0f}..{q3:.0f}':>16}{ratio:>9}{spread:>14}")


if __name__ == "__main__":
    main()
