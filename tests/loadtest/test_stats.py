"""Unit tests of the load test's pure parts: statistics and phase derivation."""

from __future__ import annotations

import pytest

from sandfleet.fleet.loadtest.phases import PHASES, final_state, job_phases, record_summary
from sandfleet.fleet.loadtest.stats import (
    command_delta,
    commands_per_job,
    completion_times,
    failures_by_kind,
    parse_commandstats,
    percentile,
    phase_summaries,
    summarize,
    throughput,
    windowed_rate,
)


def test_percentile_interpolates_between_ranks_like_numpy() -> None:
    values = [4.0, 1.0, 3.0, 2.0]
    assert percentile(values, 0) == 1.0
    assert percentile(values, 100) == 4.0
    assert percentile(values, 50) == pytest.approx(2.5)
    assert percentile(values, 95) == pytest.approx(3.85)


def test_percentile_of_one_value_is_that_value() -> None:
    assert percentile([7.5], 99) == 7.5


@pytest.mark.parametrize("values, q", [([], 50), ([1.0], -1), ([1.0], 101)])
def test_percentile_refuses_nonsense(values: list[float], q: float) -> None:
    with pytest.raises(ValueError):
        percentile(values, q)


def test_summarize_gives_quantiles_and_max() -> None:
    summary = summarize([float(n) for n in range(1, 101)])
    assert summary["count"] == 100
    assert summary["p50"] == pytest.approx(50.5)
    assert summary["p95"] == pytest.approx(95.05)
    assert summary["p99"] == pytest.approx(99.01)
    assert summary["max"] == 100.0
    assert summary["mean"] == pytest.approx(50.5)


def test_summarize_of_nothing_has_no_figures() -> None:
    assert summarize([]) == {"count": 0, "mean": None, "p50": None, "p95": None, "p99": None, "max": None}


def test_phase_summaries_count_only_jobs_with_the_phase() -> None:
    out = phase_summaries([{"run": 1.0, "model": 2.0}, {"run": 3.0}], ["run", "model", "tool"])
    assert list(out) == ["run", "model", "tool"]
    assert out["run"]["count"] == 2 and out["run"]["p50"] == 2.0
    assert out["model"]["count"] == 1
    assert out["tool"]["count"] == 0


def test_failures_by_kind_names_unfinished_jobs() -> None:
    jobs = [
        {"status": "succeeded", "ended_at": 1.0},
        {"status": "failed", "ended_at": 1.0, "error_kind": "program"},
        {"status": "failed", "ended_at": 2.0, "error_kind": "program"},
        {"status": "timed_out", "ended_at": 2.0, "error_kind": None},
        {"status": "running", "ended_at": None},
    ]
    assert failures_by_kind(jobs) == {"program": 2, "timed_out": 1, "unfinished": 1}


def test_throughput_and_completion_times() -> None:
    assert throughput(10, 100.0, 105.0) == 2.0
    assert throughput(0, 100.0, 105.0) is None
    assert throughput(3, 5.0, 5.0) is None
    assert completion_times([103.0, None, 101.5], 100.0) == [1.5, 3.0]


def test_windowed_rate_counts_events_inside_the_window() -> None:
    assert windowed_rate([1.0, 2.0, 4.5, 5.0], now=5.0, window_s=2.0) == 1.0
    with pytest.raises(ValueError):
        windowed_rate([], now=1.0, window_s=0)


def test_commandstats_delta_and_per_job() -> None:
    before = parse_commandstats(
        {"cmdstat_get": {"calls": 5, "usec": 1}, "redis_version": "7", "cmdstat_set": {"calls": 1}}
    )
    after = parse_commandstats(
        {"cmdstat_get": {"calls": 25}, "cmdstat_set": {"calls": 1}, "cmdstat_info": {"calls": 2}}
    )
    delta = command_delta(before, after)
    assert delta == {"get": 20, "info": 2}
    per_job = commands_per_job(delta, 10, own_calls=2, idle_rate_per_s=1.0, duration_s=10.0)
    assert per_job["raw"] == pytest.approx(2.2)
    assert per_job["net"] == pytest.approx(1.0)
    assert commands_per_job(delta, 0)["raw"] is None


def test_job_phases_from_timestamps_and_timings() -> None:
    stamps = {"queued": 100.0, "running": 100.5, "succeeded": 103.0}
    timings = {"model_s": 2.0, "acquire_s": 0.01, "run_s": 0.2, "tool_s": 0.05, "total_s": 2.3}
    phases = job_phases(stamps, timings)
    assert phases["queue_wait"] == pytest.approx(0.5)
    assert phases["model"] == 2.0 and phases["acquire"] == 0.01 and phases["tool"] == 0.05
    assert phases["result_write"] == pytest.approx(0.2)
    assert phases["end_to_end"] == pytest.approx(3.0)
    assert phases["end_to_end_excl_model"] == pytest.approx(1.0)
    assert set(phases) <= set(PHASES)


def test_job_phases_of_a_job_refused_before_the_engine() -> None:
    phases = job_phases({"queued": 1.0, "refused": 1.2}, None)
    assert phases == {"end_to_end": pytest.approx(0.2), "end_to_end_excl_model": pytest.approx(0.2)}


def test_final_state_and_record_summary() -> None:
    assert final_state({"queued": 1.0, "running": 2.0}) is None
    record = {
        "job_id": "j1",
        "status": "failed",
        "timestamps": {"queued": 1.0, "running": 1.1, "failed": 2.0},
        "attempts": 1,
        "deliveries": 1,
        "worker": "w1",
        "result": {"error": {"kind": "program", "message": "exit 1"}, "timings": {"total_s": 0.5}},
    }
    summary = record_summary(record)
    assert summary["ended_at"] == 2.0 and summary["error_kind"] == "program"
    assert summary["phases"]["result_write"] == pytest.approx(0.4)


def test_job_phases_split_the_engine_with_attempt_timings() -> None:
    stamps = {"queued": 0.0, "running": 0.1, "succeeded": 1.0}
    timings = {"model_s": 0.2, "acquire_s": 0.1, "run_s": 0.3, "total_s": 0.8}
    phases = job_phases(stamps, timings, [{"files_s": 0.05, "start_s": 0.05}])
    assert phases["files"] == 0.05 and phases["exec_start"] == 0.05
    assert phases["engine_other"] == pytest.approx(0.1)
