"""Recent demand for one sandbox config: the most containers wanted at once over a sliding window.

The pool keeps warm containers in proportion to this (pool.py): a burst raises it at once, and it
falls back only after the window has passed with less demand, so an idle pool shrinks back to its
floor while a busy one stays full between the waves of a burst. Pure: the caller passes the time.
"""

from __future__ import annotations

from collections import deque

DEMAND_WINDOW_S = 30.0


class DemandWindow:
    """The peak of a step function (containers wanted at once) over the last ``window_s`` seconds."""

    def __init__(self, window_s: float = DEMAND_WINDOW_S) -> None:
        self.window_s = window_s
        self.current = 0
        # Past levels as (time they ended, level), levels decreasing from left to right: a sliding
        # maximum, so the peak is the first entry still inside the window (or the current level).
        self._past: deque[tuple[float, int]] = deque()

    def set(self, wanted: int, now: float) -> None:
        """The number of containers wanted from ``now`` on."""
        if wanted == self.current:
            return
        ended = self.current
        while self._past and self._past[-1][1] <= ended:
            self._past.pop()
        self._past.append((now, ended))
        self.current = wanted

    def peak(self, now: float) -> int:
        """The most containers wanted at any time in the last ``window_s`` seconds, now included."""
        while self._past and self._past[0][0] < now - self.window_s:
            self._past.popleft()
        return max(self.current, self._past[0][1] if self._past else 0)

    def next_change(self, now: float) -> float | None:
        """Seconds until ``peak`` may fall (the oldest level leaves the window), or None."""
        self.peak(now)
        if not self._past or self._past[0][1] <= self.current:
            return None
        return max(0.0, self._past[0][0] + self.window_s - now)
