"""Jobs/s through a multi-host fleet of 1, 2, 3 hosts on this machine, and per-host efficiency.

Each size is one ``sandfleet loadtest --local --hosts N --json`` (a subprocess, printed with its
command). Every host gets the same slots. "vs 1 host" is jobs/s of N hosts over one host's: the
machine's cores bound the total, so near 1 means the extra engines and workers cost little, and the
per-host efficiency is that ratio over N.

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
    rows = {n: run(n, args.jobs, args.sandboxes) for n in sizes}
    base = rows[sizes[0]]["jobs_per_s"] if sizes[0] == 1 else None
    print(f"{'hosts':>5} {'jobs':>5} {'ok':>5} {'lost':>4} {'twice':>5} {'jobs/s':>7} {'vs 1 host':>9}")
    for n, r in rows.items():
        rate = r["jobs_per_s"] or 0.0
        ratio = f"{rate / base:.2f}" if isinstance(base, float) and base else "-"
        print(
            f"{n:>5} {r['jobs']:>5} {r['succeeded']:>5} {r['lost']:>4} {r['done_twice']:>5} {rate:>7.2f} {ratio:>9}"
        )
    print(json.dumps(rows))


if __name__ == "__main__":
    main()
