"""``report.png``: completions over time, and the latency distribution by phase."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from sandfleet.fleet.loadtest.phases import PHASES

FIGSIZE_IN = (11, 4.5)
BIN_S = 1.0


def write_plot(report: dict[str, Any], out: Path) -> Path:
    """Draw the two panels from ``report`` (as :func:`build_report` makes it) into ``out/report.png``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=FIGSIZE_IN)
    try:
        times = report["completions_s"]
        left.step(times, range(1, len(times) + 1), where="post", label="jobs ended")
        left.set_xlabel("seconds since the first submit")
        left.set_ylabel("jobs ended (cumulative)")
        if times:
            rate_axis = left.twinx()
            bins = max(1, int(times[-1] / BIN_S) + 1)
            rate_axis.hist(times, bins=bins, range=(0, bins * BIN_S), alpha=0.25, color="tab:orange")
            rate_axis.set_ylabel(f"jobs ended per {BIN_S:g} s", color="tab:orange")
        tput = report.get("throughput_jobs_per_s")
        left.set_title(f"completions ({tput:.2f} jobs/s)" if tput else "completions")

        phases = [p for p in PHASES if any(p in j["phases"] for j in report["jobs"])]
        values = [[j["phases"][p] * 1000 for j in report["jobs"] if p in j["phases"]] for p in phases]
        if phases:
            right.boxplot(values, whis=(5, 95), showfliers=True, flierprops={"markersize": 2})
            right.set_xticks(range(1, len(phases) + 1), phases, rotation=35, ha="right")
            right.set_yscale("symlog", linthresh=1.0)
            right.set_ylim(bottom=0)
        right.set_ylabel("milliseconds (whiskers p5-p95)")
        right.set_title("latency by phase")
        fig.suptitle(f"sandfleet loadtest: {report['counts']['submitted']} jobs, {report['mode']}")
        fig.tight_layout()
        path = out / "report.png"
        out.mkdir(parents=True, exist_ok=True)
        fig.savefig(path, dpi=100)
    finally:
        plt.close(fig)
    return path
