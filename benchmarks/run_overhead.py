"""Whole-run overhead: ``print("RESULT: 1")`` end to end through the runtime vs its own run time.

    .venv/bin/python benchmarks/run_overhead.py [--runs 50] [--cold-runs 20] [--runtimes runc,runsc]

End to end is the wall time of ``ProgramRuntime.run`` as the caller sees it (perf_counter around the
call). The program's own run time is ``timings["run_s"]``, measured by the in-container agent from
spawning ``python3 program.py`` to its exit (interpreter start included). Between them: acquisition,
writing the program and stub, the frames to and from the agent, parsing. Warm: the pool is refilled
before each run. Figures only; compare the ratios.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import RUNTIMES, engine_runtimes, labelled_pool, wait_until

TRIVIAL = 'print("RESULT: 1")\n'
PHASES = ("acquire_s", "files_s", "start_s", "run_s")


def measure(backend: str, runs: int, warm: bool) -> dict[str, list[float]]:
    from sandfleet.core.config import CodeActionSettings, SandboxConfig
    from sandfleet.worker.program.runtime import ProgramRuntime

    config = SandboxConfig(backend=backend)
    settings = CodeActionSettings(exec_timeout=30)
    samples: dict[str, list[float]] = {"wall_s": [], **{p: [] for p in PHASES}}
    with labelled_pool(
        f"run-overhead-{'warm' if warm else 'cold'}", pool_size=1 if warm else 0, max_live=3
    ) as pool:
        runtime = ProgramRuntime(pool)
        if warm:
            pool.warm(config)
        for _ in range(runs):
            ready = (
                (lambda: pool.stats()["idle"] == 1 and pool.live == 1) if warm else (lambda: pool.live == 0)
            )
            if not wait_until(ready, timeout_s=60):
                raise SystemExit(f"the pool did not settle: {pool.stats()}")
            began = time.perf_counter()
            run = runtime.run(TRIVIAL, config=config, settings=settings)
            wall = time.perf_counter() - began
            if not run.ok or run.result != 1:
                raise SystemExit(f"run failed: {run.failure()}\n{run.stderr[-2000:]}")
            samples["wall_s"].append(wall)
            for phase in PHASES:
                samples[phase].append(run.timings[phase])
    return samples


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=50)
    parser.add_argument("--cold-runs", type=int, default=20)
    parser.add_argument("--runtimes", default="runc,runsc")
    args = parser.parse_args()
    available = engine_runtimes()
    for name in [r for r in args.runtimes.split(",") if r]:
        if name not in available:
            print(f"{name}: not registered with the engine, skipped")
            continue
        print(f"\n[{name}] print('RESULT: 1') through ProgramRuntime.run, medians in ms")
        for warm, runs in ((True, args.runs), (False, args.cold_runs)):
            if runs <= 0:
                continue
            s = {k: statistics.median(v) * 1000 for k, v in measure(RUNTIMES[name], runs, warm).items()}
            label = "warm" if warm else "cold"
            print(
                f"  {label} (n={runs}): end to end {s['wall_s']:7.1f}   program run_s {s['run_s']:6.1f}   "
                f"overhead {s['wall_s'] - s['run_s']:7.1f}   end-to-end / run_s {s['wall_s'] / s['run_s']:4.1f}x"
            )
            print(
                f"      phases: acquire {s['acquire_s']:7.2f}   files {s['files_s']:5.2f}   "
                f"frames to/from agent (start_s) {s['start_s']:5.2f}   run {s['run_s']:6.2f}"
            )


if __name__ == "__main__":
    main()
