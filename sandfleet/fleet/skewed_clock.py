"""A worker whose wall clock is off, for the multi-host fleet (issue 24 point 5: a host whose clock
is 30 s off): libfaketime (Debian's ``faketime``) preloaded into the host's worker with a constant
offset, the monotonic clocks left true (``FAKETIME_DONT_FAKE_MONOTONIC=1``), so every ``time.time()``
the worker reads (heartbeats, audit and record times, deadlines, the sweeps' cutoffs) is off by the
offset while its timeouts and intervals are not.

The host's engine keeps the machine's clock: dockerd is Go and reads the clock without libc. So this
is a worker off against Redis, the producers, the other hosts *and its own engine*; on a real host
the engine would be off with it (SCALING.md §5).

libfaketime 0.9.10 (Debian 12) fails ``clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME)`` with
EINVAL under ``FAKETIME_DONT_FAKE_MONOTONIC`` (wolfcw/libfaketime#426), and Python 3.11's
``time.sleep`` is made of that call; every other wait (events, locks, conditions, select, sockets)
works. So a skewed worker's ``time.sleep`` waits on an event instead (:data:`SLEEP_WITHOUT_ABSTIME`,
put in front of its ``-c`` code; a Python child of the worker would inherit the preload but not
this, so a skewed host runs no MCP stdio server here). Without ``FAKETIME_DONT_FAKE_MONOTONIC`` the
monotonic clock becomes the faked wall clock and a ``-30s`` worker hangs in its first timed wait.
"""

from __future__ import annotations

import glob
import re

LIBFAKETIME_GLOB = "/usr/lib/*/faketime/libfaketime.so.1"
OFFSET = re.compile(r"[+-]\d{1,6}(\.\d+)?[smhd]?")
SLEEP_WITHOUT_ABSTIME = (
    "import threading as _t, time as _time; _time.sleep = lambda s, _e=_t.Event(): _e.wait(s) and None"
)


def libfaketime() -> str:
    """The path of libfaketime.so.1; FileNotFoundError naming the package when it is not installed."""
    found = sorted(glob.glob(LIBFAKETIME_GLOB))
    if not found:
        raise FileNotFoundError(
            "libfaketime is not installed (apt-get install faketime, or run deploy/bootstrap.sh)"
        )
    return found[0]


def check_clocks(clocks: dict[int, str], hosts: int) -> dict[int, str]:
    """``clocks`` when each names a host of 1..``hosts`` and an offset like ``+30s`` or ``-1.5m``.

    Raises:
        ValueError: naming the host or the offset and the form.
    """
    for host, offset in clocks.items():
        if not 1 <= host <= hosts:
            raise ValueError(f"a clock offset for host {host}: the hosts are 1..{hosts}")
        if not OFFSET.fullmatch(offset):
            raise ValueError(f"clock offset {offset!r} is not of the form +30s, -30s, +1.5m, -2h")
    return dict(clocks)


def skewed_clock_env(offset: str) -> dict[str, str]:
    """The environment that runs a process with its wall clock ``offset`` away, monotonic clocks true."""
    return {
        "LD_PRELOAD": libfaketime(),
        "FAKETIME": offset,
        "FAKETIME_DONT_FAKE_MONOTONIC": "1",
    }
