"""The sandbox's container under each OCI runtime the engine has: create, start, wait, remove, in one run.

    .venv/bin/python benchmarks/oci_runtimes.py [--cycles 30] [--runtimes runc,crun,runsc]
    .venv/bin/python benchmarks/oci_runtimes.py --gvisor-variants [--cycles 10]

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

``--gvisor-variants``: gVisor's options (platform, overlay) as runtimes of their own, registered with a
dockerd of this script's own (its socket, data-root, exec-root and containerd under a temporary
folder, in a network namespace of its own with no bridge and no iptables: the machine's engine, its
daemon.json and its docker0 are never touched; a dockerd started with ``--bridge=none`` in the
machine's namespace deletes docker0, which broke every bridged test running beside it), with the
sandbox image loaded from the machine's engine. Each variant's view from inside is compared with
runsc's as bootstrap registers it (ptrace, no overlay), and timed beside it and runc.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from container_options import ONE_SHOT, one_shot

from sandfleet.core.config import SandboxConfig
from sandfleet.fleet import netns
from sandfleet.worker.sandbox.docker import backend as engine
from sandfleet.worker.sandbox.docker.probe import isolation_view, view_differences
from sandfleet.worker.sandbox.docker.spec import Owner, container_kwargs

LABEL_RUN = "sandfleet.bench"
# runsc's options on this machine's release as extra runtimes (--network=none as bootstrap's runsc has,
# which network_disabled needs). Checked against `runsc flags` of Debian's 0.0~20221219: platforms
# ptrace and kvm only (systrap came in 2023), --overlay2 {root,all}:{memory,DIR} or none, no directfs
# (2023 too), --lisafs on by default and without effect.
GVISOR_VARIANTS = {
    "runsc": ["--network=none"],
    "runsc-kvm": ["--network=none", "--platform=kvm"],
    "runsc-overlay-root": ["--network=none", "--overlay2=root:memory"],
    "runsc-overlay-all": ["--network=none", "--overlay2=all:memory"],
}


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
    except (OSError, SystemExit) as e:  # a sandbox that never boots: the wait times out
        return f"{type(e).__name__}: {e}"
    return None


def compare_isolation(client: Any, chosen: dict[str, dict[str, Any]]) -> None:
    """Print, for each runtime of the runc class beside runc, how its view differs from runc's."""
    # gVisor's kernel answers differently from Linux by design: its variants are held against runsc
    views = {ref: isolation_view(client, chosen[ref]) for ref in ("runc", "runsc") if ref in chosen}
    for runtime, kwargs in chosen.items():
        reference = "runsc" if runtime.startswith("runsc") else "runc"
        if runtime in views or reference not in views:
            continue
        differing = view_differences(views[reference], isolation_view(client, kwargs))
        print(
            f"{runtime}: isolation seen from inside, against {reference}'s under the same options: "
            + ("the same" if not differing else f"{len(differing)} aspect(s) differ")
        )
        for aspect, (ref_has, other_has) in differing.items():
            print(f"    {aspect}: {reference} {ref_has}\n    {' ' * len(aspect)}  {runtime} {other_has}")


def mentioning(text: str) -> list[int]:
    """Pids whose command line holds ``text`` (this script's own engine folder)."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and text.encode() in (entry / "cmdline").read_bytes():
                found.append(int(entry.name))
        except OSError:
            continue
    return found


def runsc_fails(args: list[str], timeout: float = 20.0) -> str | None:
    """Why a sandbox with these runsc options cannot run ``true`` on this host, or None. A sandbox
    that never boots (kvm in this VM) is killed here rather than hang a container's create."""
    process = subprocess.Popen(
        ["runsc", *args, "do", "true"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    try:
        _, err = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()
        return f"did not finish in {timeout:g} s"
    return None if process.returncode == 0 else f"exited {process.returncode}: {err.decode()[-300:]}"


def stopped(*_: object) -> None:
    """SIGTERM as an interrupt (SystemExit would pass for a runtime's failure): the engine still goes."""
    raise KeyboardInterrupt


@contextmanager
def private_engine(image: str) -> Iterator[str]:
    """A dockerd of this script's own with GVISOR_VARIANTS registered and ``image`` loaded; its URL."""
    folder = Path(tempfile.mkdtemp(prefix="sf-oci-engine-", dir="/tmp"))
    runtimes = {}
    for name, args in GVISOR_VARIANTS.items():
        if (why := runsc_fails(args)) is not None:
            print(f"{name}: `runsc {' '.join(args)} do true` {why}; left out")
        else:
            runtimes[name] = {"path": "/usr/bin/runsc", "runtimeArgs": args}
    (folder / "daemon.json").write_text(json.dumps({"runtimes": runtimes}))
    url = f"unix://{folder}/docker.sock"
    namespace = f"sf-oci-{os.getpid()}"
    netns.add_namespace(namespace)
    log = open(folder / "dockerd.log", "ab")  # noqa: SIM115 - the child holds it
    process = subprocess.Popen(
        [*netns.enter(namespace), "dockerd", f"--config-file={folder}/daemon.json", f"--host={url}", f"--data-root={folder}/data",
         f"--exec-root={folder}/x", f"--pidfile={folder}/docker.pid", "--bridge=none", "--iptables=false",
         "--ip-masq=false", "--log-level=warn"],
        stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
    )  # fmt: skip
    log.close()
    try:
        deadline = time.monotonic() + 60
        while subprocess.run(["docker", f"--host={url}", "version"], capture_output=True).returncode != 0:
            if process.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(
                    f"the private dockerd did not start: {(folder / 'dockerd.log').read_text()[-1500:]}"
                )
            time.sleep(0.3)
        saved = subprocess.Popen(["docker", "save", image], stdout=subprocess.PIPE)
        subprocess.run(["docker", f"--host={url}", "load", "-q"], stdin=saved.stdout, check=True)
        saved.wait()
        yield url
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        for pid in mentioning(str(folder)):  # shims and sandboxes a hung container left
            os.kill(pid, signal.SIGKILL)
        subprocess.run(["umount", "-R", str(folder / "data")], capture_output=True)
        subprocess.run(["rm", "-rf", "--one-file-system", str(folder)], capture_output=True)
        netns.delete_namespace(namespace)


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
    parser.add_argument(
        "--gvisor-variants",
        action="store_true",
        help="runc and GVISOR_VARIANTS on a dockerd of this script's own",
    )
    args = parser.parse_args()
    if not args.gvisor_variants:
        compare(engine.docker_client(), args.runtimes, args.cycles)
        return
    image = kwargs_for("runsc", 1, {})["image"]
    signal.signal(signal.SIGTERM, stopped)
    with private_engine(image) as url:
        compare(engine.docker_client(url), ",".join(["runc", *GVISOR_VARIANTS]), args.cycles)


def compare(client: Any, runtimes: str, cycles: int) -> None:
    """Check, compare and time the sandbox's container under each of ``runtimes`` of ``client``'s engine."""
    info = engine.engine_info(client)
    run_label = uuid.uuid4().hex[:12]
    labels = {engine.LABEL_ROLE: "bench", LABEL_RUN: run_label}
    chosen: dict[str, dict[str, Any]] = {}
    try:
        for runtime in [r.strip() for r in runtimes.split(",") if r.strip()]:
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
        for number in range(cycles):
            shift = number % max(1, len(names))
            for runtime in names[shift:] + names[:shift]:
                samples[runtime].append(one_shot(client, chosen[runtime]))
    finally:
        for leftover in client.api.containers(all=True, filters={"label": f"{LABEL_RUN}={run_label}"}):
            try:
                client.api.remove_container(leftover["Id"], force=True)
            except Exception as e:  # a sandbox that never booted (gVisor's kvm here) may not answer
                print(f"cannot remove container {leftover['Id'][:12]}: {e}")
    if not samples:
        raise SystemExit("no runtime could start the sandbox's container")
    print(
        f"\n{cycles} cycles, one container per runtime each (create, start, wait, remove of "
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
