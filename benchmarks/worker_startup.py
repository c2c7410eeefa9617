"""How long ``sandfleet worker`` takes from process start to ready, and the CPU it spends on the way.

    .venv/bin/python benchmarks/worker_startup.py [--cycles 10]
    .venv/bin/python benchmarks/ab.py --before main --rounds 2 --grep 'median' -- benchmarks/worker_startup.py

"Ready" is the moment the worker's state is started (Celery's ``worker_ready``: signing key loaded,
heartbeat written, recovery sweeps running; sandfleet/worker/delivery/state.py): a probe wraps
``WorkerState.start``, prints a marker once it returns and stops the worker (SIGTERM, a warm
shutdown). Each cycle runs, in an order rotated per cycle, ``python -c pass`` (this interpreter's own
start: the floor) and the worker with no MCP config, no metrics port, no restricted network and no
job, against a throwaway Redis of its own. Printed: the wall time from spawn to the marker and the
process's whole CPU time (user + system, start to exit: less noisy than wall time on a shared host),
medians and p5..p95. Figures are printed, never asserted; the host's load is printed beside them.
Issue 25 point 4's figures: deploy/SCALING.md.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

from sandfleet.fleet.local_redis import RedisServer

MARKER = "WORKER-STARTUP-READY"
PROBE = (
    "import os, signal, sys\n"
    "from sandfleet.worker.delivery import state\n"
    "start = state.WorkerState.start\n"
    "def ready(self, name):\n"
    "    start(self, name)\n"
    f"    print({MARKER!r}, file=sys.stderr, flush=True)\n"
    "    os.kill(os.getpid(), signal.SIGTERM)\n"
    "state.WorkerState.start = ready\n"
    "from sandfleet.cli import main\n"
    "main(sys.argv[1:], prog_name='sandfleet')\n"
)


def timed(argv: list[str], env: dict[str, str], marker: str | None) -> tuple[float, float]:
    """``(seconds from spawn to the marker on stderr (or to exit), CPU seconds of the whole process)``."""
    start = time.perf_counter()
    process = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    assert process.stderr is not None
    seen: float | None = None
    tail: list[str] = []
    for line in process.stderr:
        tail = [*tail, line][-20:]
        if seen is None and marker is not None and marker in line:
            seen = time.perf_counter() - start
    _, status, usage = os.wait4(process.pid, 0)
    process.returncode = os.waitstatus_to_exitcode(status)
    if marker is not None and seen is None:
        raise SystemExit(f"the worker never became ready (exit {process.returncode}):\n{''.join(tail)}")
    return (seen if seen is not None else time.perf_counter() - start), usage.ru_utime + usage.ru_stime


def spread(samples: list[float]) -> str:
    ordered = sorted(samples)
    low, high = ordered[int(0.05 * (len(ordered) - 1))], ordered[round(0.95 * (len(ordered) - 1))]
    return (
        f"median {statistics.median(ordered) * 1000:6.0f} ms  (p5..p95 {low * 1000:.0f}..{high * 1000:.0f})"
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--cycles", type=int, default=10, help="runs of each command (default 10)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="sf-worker-startup-") as tmp:
        server = RedisServer(Path(tmp) / "redis").start()
        env = {
            **{k: v for k, v in os.environ.items() if not k.startswith("SANDFLEET_")},
            "SANDFLEET_REDIS_URL": server.url,
            "SANDFLEET_KEY_PREFIX": f"worker-startup-{uuid.uuid4().hex[:8]}",
            "SANDFLEET_WORKER_STATE_DIR": str(Path(tmp) / "worker-state"),
            "SANDFLEET_POOL_SIZE": "0",
        }
        commands = {
            "python -c pass": ([sys.executable, "-c", "pass"], None),
            "sandfleet worker -c 1 (spawn -> ready)": (
                [sys.executable, "-c", PROBE, "worker", "-c", "1", "-l", "warning"],
                MARKER,
            ),
        }
        wall: dict[str, list[float]] = {name: [] for name in commands}
        cpu: dict[str, list[float]] = {name: [] for name in commands}
        print(f"load before: {os.getloadavg()[0]:.2f}")
        try:
            for cycle in range(args.cycles):
                names = list(commands)
                for name in names[cycle % len(names) :] + names[: cycle % len(names)]:
                    argv, marker = commands[name]
                    seconds, cpu_s = timed(argv, env, marker)
                    wall[name].append(seconds)
                    cpu[name].append(cpu_s)
        finally:
            server.stop()
        print(f"load after: {os.getloadavg()[0]:.2f}; {args.cycles} cycles")
        for name in commands:
            print(f"{name:<40} wall {spread(wall[name])}   CPU {spread(cpu[name])}")


if __name__ == "__main__":
    main()
