"""Jobs/s through a multi-host fleet of 1, 2, 3 hosts on this machine, and per-host efficiency.

Each size is one ``sandfleet loadtest --local --hosts N --json`` (a subprocess, printed with its
command). Every host gets the same slots. "vs 1 host" is jobs/s of N hosts over one host's: the
machine's cores bound the total, so near 1 means the extra engines and workers cost little, and the
per-host efficiency is that ratio over N. "vs all slots on 1" (issue 24's target, >= 0.9 for 3
hosts) compares N hosts with one host given all N hosts' slots, run right after it: the same
slots and cores, so it measures what the extra engines, workers and links cost.

    python benchmarks/hosts.py --jobs 300 --sizes 1,2,3        # the lead's run
    python benchmarks/hosts.py --jobs 6 --sizes 1,2            # a smoke run
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys


def run(hosts: int, jobs: int, sandboxes: int) -> dict[str, object]:
    cmd = [sys.executable, "-m", "sandfleet.cli", "loadtest", "--local", "--hosts", str(hosts)]
    cmd += ["--jobs", str(jobs), "--sandboxes", str(sandboxes), "--concurrency", str(4 * sandboxes)]
    cmd += ["--no-plot", "--out", f"/tmp/sfh-bench-{hosts}", "--json"]
    print("$ sandfleet", " ".join(cmd[4:]), file=sys.stderr)
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"loadtest failed:\n{done.stderr[-2000:]}")
    report = json.loads(done.stdout)
    return {k: report.get(k) for k in ("jobs", "succeeded", "lost", "done_twice", "jobs_per_s")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=300)
    parser.add_argument("--sizes", default="1,2,3")
    parser.add_argument("--sandboxes", type=int, default=4, help="slots per host")
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    rows: dict[str, dict[str, object]] = {}
    for n in sizes:
        rows[f"{n}x{args.sandboxes}"] = run(n, args.jobs, args.sandboxes)
        if n > 1:  # one host with all of them: the same slots and cores, one engine and worker
            rows[f"1x{n * args.sandboxes}"] = run(1, args.jobs, n * args.sandboxes)
    base = rows.get(f"1x{args.sandboxes}", {}).get("jobs_per_s")
    print(
        f"{'hosts':>5} {'slots':>5} {'jobs':>5} {'ok':>5} {'lost':>4} {'twice':>5} {'jobs/s':>7} "
        f"{'vs 1 host':>9} {'vs all slots on 1':>17}"
    )
    for key, r in rows.items():
        n, slots = (int(part) for part in key.split("x"))
        rate = float(r["jobs_per_s"] or 0.0)  # type: ignore[arg-type]
        ratio = f"{rate / base:.2f}" if isinstance(base, float) and base else "-"
        pooled = rows.get(f"1x{n * slots}", {}).get("jobs_per_s") if n > 1 else None
        versus = f"{rate / pooled:.2f}" if isinstance(pooled, float) and pooled else "-"
        print(
            f"{n:>5} {slots:>5} {r['jobs']:>5} {r['succeeded']:>5} {r['lost']:>4} {r['done_twice']:>5} "
            f"{rate:>7.2f} {ratio:>9} {versus:>17}"
        )
    print(json.dumps(rows))


if __name__ == "__main__":
    main()
