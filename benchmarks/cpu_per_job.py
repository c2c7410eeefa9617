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

``--fleet`` measures instead the worker's own CPU per trivial job through a real fleet (issue 25,
point 1): one local worker (``--sandboxes`` slots, 16 jobs in flight), the model served by a replay
model server in a process of its own (the worker reaches it over HTTP with the openai client, as it
would a real endpoint), containers made by the engine. Per round, a batch of ``--jobs`` jobs is
submitted and awaited; the worker's process tree's CPU (psutil: user + system of the worker and of
its children, the containers are the engine's and not among them) is read before and after. Printed
beside it: the worker's start-up CPU (imports, key, pool warm-up), its idle CPU per second
(heartbeats, sweeps, Celery's event loop), the model server's and this process's CPU per job: the
scopes an "ms per job" can mean; and the main thread's share (Celery's event loop) against
the other threads' (the jobs), from /proc's per-thread stat. ``--profile DIR`` also records the worker with py-spy during one
more batch (``DIR/worker.txt``, collapsed stacks, and the top functions printed).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import labelled_pool, model_server, served_model_env

CGROUP_ROOTS = (Path("/sys/fs/cgroup/cpuacct/docker"), Path("/sys/fs/cgroup/docker"))
TRIVIAL = 'print("RESULT: 1")'
SCRIPT = "/workspace/cpu/program.py"
TRIVIAL_QUESTION = "print RESULT 1"
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


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


def tree_cpu_s(pid: int) -> float:
    """CPU seconds of a process and its children, live and reaped (user + system)."""
    try:
        proc = psutil.Process(pid)
        times = proc.cpu_times()
        total = times.user + times.system + times.children_user + times.children_system
        for child in proc.children(recursive=True):
            with contextlib.suppress(psutil.Error):
                t = child.cpu_times()
                total += t.user + t.system
        return total
    except psutil.Error:
        return 0.0


def main_thread_cpu_s(pid: int) -> float:
    """CPU seconds of a process's main thread alone (Celery's event loop in a worker): /proc's
    utime + stime of the thread whose id is the pid."""
    try:
        fields = Path(f"/proc/{pid}/task/{pid}/stat").read_text().rpartition(")")[2].split()
        return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS
    except (OSError, IndexError, ValueError):
        return 0.0


def fleet_batch(fleet: Any, jobs: int, model: str) -> float:
    """Submit ``jobs`` trivial jobs as one batch and wait for all; the wall seconds."""
    began = time.monotonic()
    with fleet.client() as client:
        batch = client.submit_batch([TRIVIAL_QUESTION] * jobs, model=model, tools=[])
        results = batch.wait(timeout=120 + 2 * jobs)
    bad = [r for r in results if r.status != "succeeded"]
    if bad or len(results) != jobs:
        raise SystemExit(f"{len(bad)} of {jobs} jobs did not succeed: {bad[:1]}")
    return time.monotonic() - began


def fleet_cpu(args: argparse.Namespace) -> None:
    """The worker's own CPU per trivial job through a real fleet, the model in its own process."""
    from sandfleet.fleet.local import FleetConfig, LocalFleet

    answer = {"rules": [], "default": [f"```python\n{TRIVIAL}\n```"]}
    with model_server(answer) as (base_url, server_pid):
        model = "openai:replay"
        env = {**served_model_env(base_url), "SANDFLEET_POOL_SIZE": "2"}
        env.update(dict(kv.split("=", 1) for kv in args.worker_env))
        config = FleetConfig(workers=1, sandboxes=args.sandboxes, tools="", program=TRIVIAL, env=env)
        with LocalFleet(config) as fleet:
            worker_pid = fleet.worker_pids()[0]
            started = tree_cpu_s(worker_pid)
            fleet_batch(fleet, args.sandboxes, model)  # warm-up: first jobs, pool, connections
            warmed = tree_cpu_s(worker_pid)
            time.sleep(2.0)
            idle_from, idle_began = tree_cpu_s(worker_pid), time.monotonic()
            time.sleep(args.idle_s)
            idle_per_s = (tree_cpu_s(worker_pid) - idle_from) / (time.monotonic() - idle_began)
            print(f"worker start-up CPU (until it consumes): {1000 * started:.0f} ms")
            print(
                f"worker CPU of the first {args.sandboxes} jobs (first imports, pool): {1000 * (warmed - started):.0f} ms"
            )
            print(f"worker idle CPU: {1000 * idle_per_s:.1f} ms per second")
            rows = []
            for _ in range(args.rounds):
                w0, s0, me0 = tree_cpu_s(worker_pid), tree_cpu_s(server_pid), psutil.Process().cpu_times()
                m0 = main_thread_cpu_s(worker_pid)
                wall = fleet_batch(fleet, args.jobs, model)
                w1, s1, me1 = tree_cpu_s(worker_pid), tree_cpu_s(server_pid), psutil.Process().cpu_times()
                worker_ms = 1000 * (w1 - w0) / args.jobs
                main_ms = 1000 * (main_thread_cpu_s(worker_pid) - m0) / args.jobs
                rows.append(
                    {
                        "worker": worker_ms,
                        "worker less idle": worker_ms - 1000 * idle_per_s * wall / args.jobs,
                        "main thread (Celery loop)": main_ms,
                        "other threads (jobs)": worker_ms - main_ms,
                        "model server": 1000 * (s1 - s0) / args.jobs,
                        "this process": 1000 * (me1.user + me1.system - me0.user - me0.system) / args.jobs,
                        "jobs/s": args.jobs / wall,
                    }
                )
                print("  round: " + ", ".join(f"{k} {v:.1f}" for k, v in rows[-1].items()))
            print(
                f"CPU ms per trivial job through the fleet, mean of {args.rounds} x {args.jobs}-job batches:"
            )
            for key in rows[0]:
                print(f"  {key:<28}{statistics.mean(r[key] for r in rows):8.1f}")
            whole = tree_cpu_s(worker_pid)
            done = args.sandboxes + args.rounds * args.jobs
            print(
                f"worker CPU per job over its whole life so far (start-up included): {1000 * whole / done:.1f} ms"
            )
            if args.profile:
                profile_batch(fleet, worker_pid, args, model)


def profile_batch(fleet: Any, pid: int, args: argparse.Namespace, model: str) -> None:
    """One more batch with py-spy recording the worker (collapsed stacks, idle threads left out)."""
    out = Path(args.profile)
    out.mkdir(parents=True, exist_ok=True)
    stacks = out / "worker.txt"
    spy = subprocess.Popen(
        [
            args.py_spy,
            "record",
            "--pid",
            str(pid),
            "--format",
            "raw",
            "--gil",
            "--rate",
            "250",
            "-o",
            str(stacks),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    time.sleep(1.0)
    before = tree_cpu_s(pid)
    fleet_batch(fleet, args.jobs, model)
    spent = tree_cpu_s(pid) - before
    spy.send_signal(signal.SIGINT)
    spy.wait(timeout=60)
    print(f"worker CPU per job while py-spy samples it: {1000 * spent / args.jobs:.1f} ms")
    print(f"py-spy collapsed stacks of one {args.jobs}-job batch: {stacks}")
    summarise_stacks(stacks.read_text())


# Where a sample is counted: the first place whose marks one of its frames matches (the model
# client's HTTP under the engine counts as the model client; Celery only when nothing of ours ran).
PLACES = (
    ("model client (openai, httpx)", ("worker/llm/",)),
    ("sandbox lease, run, channel", ("worker/sandbox/", "worker/program/")),
    ("audit appends (signed, Redis)", ("core/audit.py",)),
    ("final record and seal", ("finish (&core/store", "job_end.py")),
    ("other record writes (mark running, count)", ("core/store",)),
    ("engine (prompt, extract, admission)", ("worker/engine/",)),
    ("delivery (record read, checks)", ("delivery/run.py",)),
    ("Celery/kombu (protocol, events, ack)", ("celery/", "kombu/")),
)


def matches(mark: str, frame: str) -> bool:
    """``a&b``: both in the frame (py-spy's ``function (path:line)``)."""
    return all(part in frame for part in mark.split("&"))


def summarise_stacks(text: str) -> None:
    """Print the share of the worker's busy samples per place, and the top frames by self time."""
    by_place: dict[str, int] = {}
    by_self: dict[str, int] = {}
    total = 0
    for line in text.splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack or not count_text.isdigit():
            continue
        count, frames = int(count_text), stack.split(";")
        total += count
        place = next(
            (name for name, marks in PLACES if any(matches(m, f) for m in marks for f in frames)),
            "other (threads' loops, timers, sweeps)",
        )
        by_place[place] = by_place.get(place, 0) + count
        leaf = frames[-1]
        by_self[leaf] = by_self.get(leaf, 0) + count
    print(f"py-spy samples (the thread holding the GIL): {total}")
    for place, count in sorted(by_place.items(), key=lambda kv: -kv[1]):
        print(f"  {place:<44}{100 * count / max(total, 1):6.1f}%")
    print("top frames by self time:")
    for leaf, count in sorted(by_self.items(), key=lambda kv: -kv[1])[:15]:
        print(f"  {100 * count / max(total, 1):5.1f}%  {leaf[:110]}")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--jobs", type=int, default=100, help="jobs per measurement")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--sandboxes", type=int, default=4, help="threads = containers at once")
    parser.add_argument("--runs", type=int, default=15, help="sandboxes for the inside view, each way")
    parser.add_argument("--fleet", action="store_true", help="the worker's own CPU per job, real fleet")
    parser.add_argument("--idle-s", type=float, default=10.0, help="--fleet: seconds to measure idle")
    parser.add_argument(
        "--profile",
        default="",
        help="--fleet: a folder for a py-spy profile (--gil: the thread holding the GIL)",
    )
    parser.add_argument("--py-spy", default="py-spy", help="--profile: the py-spy executable")
    parser.add_argument("--worker-env", action="append", default=[], help="--fleet: NAME=VALUE")
    args = parser.parse_args()
    if args.fleet:
        fleet_cpu(args)
        return

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
