"""Engine overhead per job: the time a job spends outside the model and outside the sandbox.

    .venv/bin/python benchmarks/engine_overhead.py [--jobs 200] [--pool-size 2] [--json]

Runs the reference scenario (ARCHITECTURE.md) as ``--jobs`` jobs, one after another, through ``run_job``: a
zero-latency replay server over HTTP answers with the reference program, the real ``openai`` client
calls it, and every program runs in a fresh container from a warm pool, with the orders tool served
from the host. For each job the JobResult's timings give

    overhead = total_s - model_s - sandbox_s

that is: validating the spec, checking the policy, building the prompt, extracting the program,
audit events (in memory here) and assembling the result. ``model_s`` is the client's wall time for the
call (HTTP to the local server included); ``sandbox_s`` is the runtime's (acquire a container, copy
the program, run it with the tool bridge, hand the container to the remover).

Prints the median (and p90) of each over the jobs, after ``--warmup`` unrecorded jobs, plus the
in-process cost of the pure parts (prompt building and extraction) for scale. Needs Docker and the
sandbox image. Every job must succeed with the exact reference answer, or the script fails.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
import timeit
from typing import Any

DEFAULT_JOBS = 200
DEFAULT_WARMUP_JOBS = 5
DEFAULT_POOL_SIZE = 2
DEFAULT_MAX_SANDBOXES = 4
PURE_REPEATS = 2000
FIGURES = ("overhead_s", "total_s", "model_s", "sandbox_s")


def percentile(values: list[float], fraction: float) -> float:
    """The value below which ``fraction`` of ``values`` lie (nearest rank)."""
    ranked = sorted(values)
    index = min(len(ranked) - 1, max(0, round(fraction * len(ranked)) - 1))
    return ranked[index]


def run_jobs(jobs: int, warmup: int, pool_size: int, max_sandboxes: int) -> dict[str, list[float]]:
    """Run the reference scenario ``warmup + jobs`` times; the timings of the last ``jobs``, in seconds."""
    from sandfleet.core.contracts import JobSpec, JobStatus
    from sandfleet.core.settings import Settings
    from sandfleet.worker.engine import EngineOptions, EngineServices, ListAudit, run_job
    from sandfleet.worker.llm.scripted.script import parse_script
    from sandfleet.worker.llm.scripted.server import ReplayServer
    from sandfleet.worker.tools.examples.scenario import (
        REFERENCE_ANSWER,
        REFERENCE_PROGRAM,
        REFERENCE_QUESTION,
    )
    from sandfleet.worker.tools.registry import ToolRegistry

    reply = f"```python\n{REFERENCE_PROGRAM}```\n"
    script = parse_script({"rules": [{"match": "revenue per region", "responses": [reply]}]})
    settings = Settings(
        model_api_key=None, model_base_url=None, pool_size=pool_size, max_sandboxes=max_sandboxes
    )
    registry = ToolRegistry.from_modules(["sandfleet.worker.tools.examples.orders"])
    spec = JobSpec(question=REFERENCE_QUESTION, tools=["load_orders"], model="openai:replay")
    timings: dict[str, list[float]] = {name: [] for name in FIGURES}
    with (
        ReplayServer(script, latency_s=0.0) as server,
        EngineServices.start(
            settings, EngineOptions(registry=registry, pool_size=pool_size, max_sandboxes=max_sandboxes)
        ) as services,
    ):
        for number in range(warmup + jobs):
            result = run_job(
                spec, f"bench-{number:04d}", services=services, audit=ListAudit(), base_url=server.base_url
            )
            if result.status != JobStatus.SUCCEEDED or result.result != REFERENCE_ANSWER:
                raise SystemExit(f"job {number} did not answer right: {result.status} {result.error}")
            if number < warmup:
                continue
            t = result.timings
            timings["total_s"].append(t["total_s"])
            timings["model_s"].append(t["model_s"])
            timings["sandbox_s"].append(t["sandbox_s"])
            timings["overhead_s"].append(t["total_s"] - t["model_s"] - t["sandbox_s"])
    return timings


def pure_parts_s() -> dict[str, float]:
    """Seconds per call of the pure steps, measured in-process: prompt building and program extraction."""
    from sandfleet.core.contracts import Turn
    from sandfleet.worker.engine.extract import extract_program
    from sandfleet.worker.engine.prompt import first_messages, system_message
    from sandfleet.worker.tools.examples.scenario import REFERENCE_PROGRAM, REFERENCE_QUESTION
    from sandfleet.worker.tools.registry import ToolRegistry

    tools = ToolRegistry.from_modules(["sandfleet.worker.tools.examples.orders"]).describe()
    history = [
        Turn(role="user", content="earlier question"),
        Turn(role="assistant", content="earlier answer"),
    ]
    reply = f"Here is the program.\n\n```python\n{REFERENCE_PROGRAM}```\n"

    def build() -> None:
        system = system_message(tools, max_tool_calls=50, data_science=False)
        first_messages(REFERENCE_QUESTION, history, system)

    return {
        "prompt_build_s": timeit.timeit(build, number=PURE_REPEATS) / PURE_REPEATS,
        "extract_s": timeit.timeit(lambda: extract_program(reply), number=PURE_REPEATS) / PURE_REPEATS,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=DEFAULT_JOBS, help="jobs measured (default 200)")
    parser.add_argument(
        "--warmup", type=int, default=DEFAULT_WARMUP_JOBS, help="jobs run first, not measured"
    )
    parser.add_argument("--pool-size", type=int, default=DEFAULT_POOL_SIZE, help="warm containers kept")
    parser.add_argument("--max-sandboxes", type=int, default=DEFAULT_MAX_SANDBOXES, help="live containers")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = parser.parse_args(argv)

    from sandfleet.worker.tools.examples.scenario import write_reference_data

    with tempfile.TemporaryDirectory(prefix="sandfleet-bench-") as folder:
        write_reference_data(folder)
        # The example tools read the data folder from the settings, that is from this variable.
        os.environ["SANDFLEET_DATA_DIR"] = folder
        began = time.perf_counter()
        timings = run_jobs(args.jobs, args.warmup, args.pool_size, args.max_sandboxes)
        wall_s = time.perf_counter() - began
    pure = pure_parts_s()

    figures: dict[str, Any] = {
        "jobs": args.jobs,
        "wall_s": wall_s,
        **{f"median_{name}": statistics.median(values) for name, values in timings.items()},
        **{f"p90_{name}": percentile(values, 0.9) for name, values in timings.items()},
        "median_overhead_share": statistics.median(
            o / t for o, t in zip(timings["overhead_s"], timings["total_s"], strict=True)
        ),
        **pure,
    }
    if args.json:
        print(json.dumps(figures, indent=2))
        return 0
    print(
        f"engine overhead over {args.jobs} jobs (reference scenario, zero-latency replay model, real Docker)"
    )
    print(f"{'per job':<12}{'median':>12}{'p90':>12}")
    for name in FIGURES:
        label = name.removesuffix("_s")
        print(
            f"{label:<12}{figures[f'median_{name}'] * 1000:>10.2f} ms{figures[f'p90_{name}'] * 1000:>9.2f} ms"
        )
    print(f"overhead share of total (median): {figures['median_overhead_share']:.1%}")
    print(
        f"pure parts per call: prompt building {pure['prompt_build_s'] * 1e6:.1f} us, "
        f"program extraction {pure['extract_s'] * 1e6:.1f} us"
    )
    print(f"wall time {wall_s:.1f} s for {args.jobs + args.warmup} jobs")
    return 0


if __name__ == "__main__":
    sys.exit(main())
