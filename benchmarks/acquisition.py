"""Sandbox acquisition as a run sees it: warm pool vs cold start, in one run.

    .venv/bin/python benchmarks/acquisition.py [--runs 100] [--runtimes runc]

Each run is ``print("RESULT: 1")`` through ProgramRuntime; the figure is the run's own
``timings["acquire_s"]`` (from asking the pool to holding a container whose agent said hello).
Warm: pool_size 1, and before each run the pool is given time to refill (and the previous
container to go), so every lease finds a container ready. Cold: pool_size 0, so every run starts its
container itself (after the previous one is gone). Figures only; compare the ratio.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import RUNTIMES, engine_runtimes, fmt, labelled_pool, summary_ms, wait_until

TRIVIAL = 'print("RESULT: 1")\n'


def measure(backend: str, runs: int, warm: bool) -> tuple[list[float], list[float], int]:
    """acquire_s and total_s of each run, and how many leases were warm."""
    from sandfleet.core.config import CodeActionSettings, SandboxConfig
    from sandfleet.worker.program.runtime import ProgramRuntime

    config = SandboxConfig(backend=backend)
    settings = CodeActionSettings(exec_timeout=30)
    acquire, total, warm_leases = [], [], 0
    name = f"acquisition-{'warm' if warm else 'cold'}"
    with labelled_pool(name, pool_size=1 if warm else 0, max_live=3) as pool:
        runtime = ProgramRuntime(pool)
        if warm:
            pool.warm(config)
        for _ in range(runs):
            ready = (
                (lambda: pool.stats()["idle"] == 1 and pool.live == 1) if warm else (lambda: pool.live == 0)
            )
            if not wait_until(ready, timeout_s=60):
                raise SystemExit(f"the pool did not settle: {pool.stats()}")
            run: Any = runtime.run(TRIVIAL, config=config, settings=settings)
            if not run.ok:
                raise SystemExit(f"run failed: {run.failure()}\n{run.stderr[-2000:]}")
            acquire.append(run.timings["acquire_s"])
            total.append(run.timings["total_s"])
            warm_leases += run.warm
    return acquire, total, warm_leases


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=100)
    parser.add_argument("--runtimes", default="runc")
    args = parser.parse_args()
    available = engine_runtimes()
    for name in [r for r in args.runtimes.split(",") if r]:
        if name not in available:
            print(f"{name}: not registered with the engine, skipped")
            continue
        backend = RUNTIMES[name]
        warm_acq, warm_total, warm_leases = measure(backend, args.runs, warm=True)
        cold_acq, cold_total, cold_leases = measure(backend, args.runs, warm=False)
        w, c = summary_ms(warm_acq), summary_ms(cold_acq)
        print(
            f"\n[{name}] sandbox acquisition as a run sees it (timings['acquire_s']), {args.runs} runs each"
        )
        print(f"  warm pool (pool_size 1, refilled)   {fmt(w)}   warm leases {warm_leases}/{args.runs}")
        print(f"  cold start (pool_size 0)            {fmt(c)}   warm leases {cold_leases}/{args.runs}")
        print(f"  cold / warm: median {c['median'] / w['median']:,.0f}x   p95 {c['p95'] / w['p95']:,.0f}x")
        tw, tc = summary_ms(warm_total), summary_ms(cold_total)
        print(f"  whole run, warm                     {fmt(tw)}")
        print(f"  whole run, cold                     {fmt(tc)}")
        print(
            f"  target: warm median < 10 ms and >= 20x faster than cold -> {w['median']:.3f} ms, "
            f"{c['median'] / w['median']:,.0f}x ({'met' if w['median'] < 10 and c['median'] >= 20 * w['median'] else 'NOT met'})"
        )


if __name__ == "__main__":
    main()
