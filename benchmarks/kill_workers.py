"""kill -9 workers in the middle of jobs, again and again: jobs lost and redelivery time.

    .venv/bin/python benchmarks/kill_workers.py --kills 20

Starts its own redis-server (no persistence needed: Redis is not what fails here) and two real
``sandfleet worker`` processes; each round submits a job whose program sleeps 8 s in a Docker
sandbox (replay model), kill -9s the worker running it, starts a replacement, and measures the time
until another worker runs the job, whether it completes with exactly one final record, and the time
until the dead worker's container is reaped. Prints a table and writes artifacts/kill-workers.json.
Goal: 0 lost.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests"))  # the harness imports sandfleet_testing, as the tests do

from sandfleet.fleet.local_redis import RedisServer  # noqa: E402
from tests.reliability.harness import kill_round, reliability_fleet, sleeper_script  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kills", type=int, default=20)
    parser.add_argument("--sleep", type=float, default=8.0, help="seconds each job's program sleeps")
    parser.add_argument("--out", type=Path, default=REPO / "artifacts" / "kill-workers.json")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="sf-kill-") as tmp:
        folder = Path(tmp)
        server = RedisServer(folder / "redis").start()
        fleet = reliability_fleet(server.url, folder / "fleet")
        rounds = []
        try:
            fleet.start_worker()
            fleet.start_worker()
            model = f"replay:{sleeper_script(fleet.scripts_dir, args.sleep)}"
            with fleet.client() as client:
                for i in range(args.kills):
                    r = kill_round(fleet, client, model)
                    rounds.append(r)
                    print(
                        f"kill {i + 1:2d}: redelivered {r['redelivered_s'] or float('nan'):5.1f} s, "
                        f"reaped {r['reaped_s'] or float('nan'):5.1f} s, final records {r['final_records']}, "
                        f"deliveries {r['deliveries']}, {'LOST' if r['lost'] else r['status']}",
                        flush=True,
                    )
        finally:
            fleet.stop()
            server.stop()
    redelivery = [r["redelivered_s"] for r in rounds if r["redelivered_s"] is not None]
    reaped = [r["reaped_s"] for r in rounds if r["reaped_s"] is not None]
    summary = {
        "kills": len(rounds),
        "lost": sum(r["lost"] for r in rounds),
        "duplicate_final_records": sum(r["final_records"] > 1 for r in rounds),
        "redelivery_p50_s": round(statistics.median(redelivery), 1) if redelivery else None,
        "redelivery_max_s": round(max(redelivery), 1) if redelivery else None,
        "reaped_p50_s": round(statistics.median(reaped), 1) if reaped else None,
        "reaped_max_s": round(max(reaped), 1) if reaped else None,
        "not_reaped_within_60_s": len(rounds) - len(reaped),
        "rounds": rounds,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(summary, indent=2) + "\n")
    print(json.dumps({k: v for k, v in summary.items() if k != "rounds"}, indent=2))
    return 0 if summary["lost"] == 0 else 1


if __name__ == "__main__":
    raise SystemExit(main())
