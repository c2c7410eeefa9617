"""The demand window the pool sizes itself by (sandfleet/worker/sandbox/demand.py): pure, time passed in."""

from __future__ import annotations

from sandfleet.worker.sandbox.demand import DemandWindow


def test_the_peak_is_the_most_wanted_at_once_within_the_window() -> None:
    window = DemandWindow(window_s=30)
    assert window.peak(0) == 0
    window.set(16, now=0)  # a burst of 16 jobs
    window.set(4, now=1)
    window.set(9, now=2)
    window.set(0, now=3)  # the burst is over
    assert window.peak(3) == 16
    assert window.peak(30.9) == 16  # 16 was wanted until t=1, still inside the window at t=30.9
    assert window.peak(31.5) == 9  # then the next highest level still inside (it ended at t=3)
    assert window.peak(33.5) == 0  # idle for a whole window: back to nothing


def test_the_current_level_counts_however_old() -> None:
    window = DemandWindow(window_s=10)
    window.set(5, now=0)
    assert window.peak(1000) == 5  # 5 jobs in flight for a long time, no change since


def test_next_change_says_when_the_peak_may_fall() -> None:
    window = DemandWindow(window_s=10)
    window.set(8, now=0)
    assert window.next_change(5) is None  # at its peak now: nothing to wait for
    window.set(2, now=5)
    assert window.next_change(6) == 9.0  # the 8 ended at t=5 and leaves the window at t=15
    assert window.peak(15.5) == 2 and window.next_change(15.5) is None


def test_a_rise_replaces_lower_levels_it_dominates() -> None:
    window = DemandWindow(window_s=10)
    for now, wanted in enumerate([1, 2, 3, 4, 5]):
        window.set(wanted, now=now)
    window.set(0, now=5)
    assert window.peak(14.9) == 5 and window.peak(15.1) == 0
