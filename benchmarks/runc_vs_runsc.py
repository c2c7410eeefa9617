"""Benchmark 5: cost per job under runc against runsc (gVisor), as ratios measured in one run.

    .venv/bin/python benchmarks/runc_vs_runsc.py [--jobs 60] [--sandboxes 4]

One local worker; the same trivial jobs with the default sandbox (runc) and with ``-o backend=gvisor``
(runsc), alternating runc, runsc, runc so drift shows. For each: fleet throughput and per-job phases
(acquire, program run, engine). Raw ``docker run --rm`` churn under both runtimes at the same
concurrency too. Printed, not asserted.
"""

from __future__ import annotations

import argparse
import statistics

from sandfleet.core.config import SandboxConfig
from sandfleet.fleet.loadtest.churn import TRIVIAL_PROGRAM, measure_churn
from sandfleet.fleet.loadtest.session import LoadTestOptions, make_plan, run_on_fleet
from sandfleet.fleet.local import FleetConfig, LocalFleet

GVISOR = {"backend": "gvisor"}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--jobs", type=int, default=60)
    parser.add_argument("--sandboxes", type=int, default=4)
    parser.add_argument("--concurrency", type=int, default=16)
    args = parser.parse_args()

    config = FleetConfig(
        workers=1, concurrency=args.concurrency, sandboxes=args.sandboxes, tools="", program=TRIVIAL_PROGRAM
    )
    runs: dict[str, list[dict]] = {"runc": [], "runsc": []}
    with LocalFleet(config) as fleet:
        for name, sandbox in (("runc", {}), ("runsc", GVISOR), ("runc", {})):
            opts = LoadTestOptions(
                jobs=args.jobs,
                tools_module="",
                program=TRIVIAL_PROGRAM,
                sandbox=sandbox,
                warmup=args.sandboxes,
            )
            report = run_on_fleet(fleet, make_plan(opts, fleet.model, warmup=args.sandboxes))
            runs[name].append(report)
            p = report["phases_s"]
            print(
                f"fleet {name}: {report['throughput_jobs_per_s']:.2f} jobs/s, {report['counts']['succeeded']}/"
                f"{args.jobs} ok; p50 ms acquire {p['acquire']['p50'] * 1000:.0f}, run {p['run']['p50'] * 1000:.0f}, "
                f"engine {p['engine']['p50'] * 1000:.0f}, end to end {p['end_to_end']['p50'] * 1000:.0f}; "
                f"failures {report['failures_by_kind'] or 'none'}"
            )
    churn = {
        "runc": measure_churn(args.jobs, args.sandboxes),
        "runsc": measure_churn(args.jobs, args.sandboxes, SandboxConfig(**GVISOR)),
    }
    for name, result in churn.items():
        print(
            f"raw churn {name}: {result.jobs_per_s:.2f} jobs/s, per run p50 {result.per_run_s['p50'] * 1000:.0f} ms, "
            f"{result.failures} failures"
        )

    def mean_of(name: str, key: str) -> float:
        return statistics.mean(r[key] for r in runs[name])

    def phase_p50(name: str, phase: str) -> float:
        return statistics.mean(r["phases_s"][phase]["p50"] for r in runs[name])

    print("\nrunsc / runc cost per job (higher = runsc dearer):")
    print(
        f"  fleet, 1/throughput: {mean_of('runc', 'throughput_jobs_per_s') / mean_of('runsc', 'throughput_jobs_per_s'):.2f}"
    )
    print(f"  fleet, program run p50: {phase_p50('runsc', 'run') / phase_p50('runc', 'run'):.2f}")
    print(
        f"  fleet, engine p50 (acquire + run + files): {phase_p50('runsc', 'engine') / phase_p50('runc', 'engine'):.2f}"
    )
    print(f"  raw churn, 1/throughput: {churn['runc'].jobs_per_s / churn['runsc'].jobs_per_s:.2f}")


if __name__ == "__main__":
    main()
