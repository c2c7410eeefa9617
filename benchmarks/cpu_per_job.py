"""Where the CPU of one trivial job goes: raw churn against the program runtime, side by side.

    .venv/bin/python benchmarks/cpu_per_job.py [--jobs 100] [--rounds 2] [--sandboxes 4] [--runs 15]

On a 2-core host throughput is CPU: jobs/s = available CPU / CPU per job. This prints CPU per job by
where it is spent, for raw ``docker run --rm`` churn and for ProgramRuntime runs of
``print("RESULT: 1")`` from ``--sandboxes`` threads (the sandbox path of a job, without Celery,
Redis or the model), alternating, ``--rounds`` times each:

- containers: everything run inside the containers (Docker's cpuacct cgroup, which keeps the
  usage of removed containers: cgroup v1 ``cpuacct/docker``, or v2 ``docker``);
- dockerd and containerd (psutil; the per-container shims and runc are short-lived and land in
  "rest", with the kernel's own work);
- this process (the Docker SDK calls, the pool, the channel to the agent).

Then, per sandbox, the CPU inside its own cgroup: the agent's start (until its hello), and a run of
the trivial program by exec of a new ``python3 -s`` against a run in a fork of the agent
(``ExecResult.forked``). Figures only, never asserted.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import labelled_pool

CGROUP_ROOTS = (Path("/sys/fs/cgroup/cpuacct/docker"), Path("/sys/fs/cgroup/docker"))
TRIVIAL = 'print("RESULT: 1")'
SCRIPT = "/workspace/cpu/program.py"


def cgroup_cpu_s(folder: Path) -> float | None:
    """CPU seconds used so far by a cgroup (v1 cpuacct.usage, or v2 cpu.stat usage_usec)."""
    try:
        return int((folder / "cpuacct.usage").read_text()) / 1e9
    except OSError:
        pass
    try:
        for line in (folder / "cpu.stat").read_text().splitlines():
            if line.startswith("usage_usec "):
                return int(line.split()[1]) / 1e6
    except OSError:
        pass
    return None


def containers_root() -> Path | None:
    return next((root for root in CGROUP_ROOTS if cgroup_cpu_s(root) is not None), None)


def snapshot(root: Path | None) -> dict[str, float]:
    """Cumulative CPU seconds by place, and the machine's busy total."""
    out: dict[str, float] = {"dockerd": 0.0, "containerd": 0.0}
    for proc in psutil.process_iter(["name"]):
        name = proc.info["name"]
        if name in out:
            try:
                times = proc.cpu_times()
                out[name] += times.user + times.system
            except psutil.Error:
                pass
    me = psutil.Process().cpu_times()
    out["this process"] = me.user + me.system
    if root is not None:
        out["containers"] = cgroup_cpu_s(root) or 0.0
    machine = psutil.cpu_times()
    out["machine"] = sum(machine) - machine.idle - getattr(machine, "iowait", 0.0)
    return out


def measure(jobs: int, root: Path | None, run: Callable[[], None]) -> dict[str, float]:
    """CPU ms per job by place, and jobs/s, for ``jobs`` jobs."""
    before, began = snapshot(root), time.monotonic()
    run()
    wall, after = time.monotonic() - began, snapshot(root)
    per_job = {k: 1000 * (after[k] - before[k]) / jobs for k in after}
    per_job["rest"] = per_job["machine"] - sum(v for k, v in per_job.items() if k != "machine")
    per_job["jobs/s"] = jobs / wall
    return per_job


def inside_one_sandbox(runs: int, root: Path) -> dict[str, list[float]]:
    """CPU ms in a sandbox's own cgroup: agent start, then one run by exec or in place."""
    from sandfleet.core.config import SandboxConfig
    from sandfleet.worker.sandbox.backends import backend_named

    found: dict[str, list[float]] = {"agent start": [], "run, new interpreter": [], "run, in place": []}
    for _ in range(runs):
        for in_place in (False, True):
            sandbox = backend_named().start(SandboxConfig(), labels={"sandfleet.benchmark": "cpu_per_job"})
            try:
                cgroup = root / sandbox.id
                started = cgroup_cpu_s(cgroup) or 0.0
                sandbox.write_file(SCRIPT, TRIVIAL.encode())
                written = cgroup_cpu_s(cgroup) or 0.0
                done = sandbox.execute(
                    ["python3", "-s", SCRIPT], timeout=30, python_script=SCRIPT if in_place else None
                )
                ran = cgroup_cpu_s(cgroup) or 0.0
            finally:
                sandbox.destroy()
            assert done.exit_code == 0 and done.forked is in_place, done.stderr
            if not in_place:
                found["agent start"].append(1000 * started)
            found["run, in place" if in_place else "run, new interpreter"].append(1000 * (ran - written))
    return found


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--jobs", type=int, default=100, help="jobs per measurement")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--sandboxes", type=int, default=4, help="threads = containers at once")
    parser.add_argument("--runs", type=int, default=15, help="sandboxes for the inside view, each way")
    args = parser.parse_args()

    from sandfleet.core.config import CodeActionSettings, SandboxConfig
    from sandfleet.fleet.loadtest.churn import measure_churn, run_concurrently
    from sandfleet.worker.program.runtime import ProgramRuntime

    root = containers_root()
    settings = CodeActionSettings(exec_timeout=30)
    results: dict[str, list[dict[str, float]]] = {"raw churn": [], "runtime": []}
    with labelled_pool("cpu_per_job", pool_size=2, max_live=args.sandboxes) as pool:
        runtime = ProgramRuntime(pool)

        def one_run() -> None:
            done = runtime.run(TRIVIAL, config=SandboxConfig(), settings=settings)
            assert done.ok, done.failure()

        for _ in range(args.rounds):
            results["raw churn"].append(
                measure(args.jobs, root, lambda: measure_churn(args.jobs, args.sandboxes))
            )
            results["runtime"].append(
                measure(args.jobs, root, lambda: run_concurrently(args.jobs, args.sandboxes, one_run))
            )

    places = ["containers", "dockerd", "containerd", "this process", "rest", "machine", "jobs/s"]
    print(f"CPU ms per trivial job, {args.sandboxes} at a time, mean of {args.rounds} x {args.jobs} jobs")
    print(f"{'':16}" + "".join(f"{p:>14}" for p in places if p in results["runtime"][0]))
    for name, rounds in results.items():
        cells = "".join(f"{statistics.mean(r[p] for r in rounds):>14.2f}" for p in places if p in rounds[0])
        print(f"{name:16}{cells}")
    raw_rate = statistics.mean(r["jobs/s"] for r in results["raw churn"])
    runtime_rate = statistics.mean(r["jobs/s"] for r in results["runtime"])
    print(f"runtime / raw churn throughput: {runtime_rate / raw_rate:.2f}")
    if root is None:
        print("containers: no Docker cpuacct cgroup found; the inside view is skipped")
        return
    print(f"\nCPU ms inside one sandbox's cgroup, median of {args.runs}")
    for name, values in inside_one_sandbox(args.runs, root).items():
        print(f"  {name:<22}{statistics.median(values):8.1f}")


if __name__ == "__main__":
    main()
