"""What a transport notices about its server's traffic, kept for the errors a call or doctor shows.

A server that writes garbage, sends a message larger than allowed, prints a traceback on stderr or
exits leaves its trace here (bounded: a few lines, a few hundred characters each), so "the call timed
out" can say why and "the server is down" can quote what it said last.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

import anyio

STDERR_LINES = 20
LINE_CHARS = 500


@dataclass
class WireState:
    """One connection's trace. ``closed`` is set when the server's side of it ended."""

    closed: anyio.Event = field(default_factory=anyio.Event)
    stderr: deque[str] = field(default_factory=lambda: deque(maxlen=STDERR_LINES))
    malformed: int = 0
    last_malformed: str = ""
    problem: str | None = None  # why the transport gave up on the connection, if it did
    exit_code: int | None = None
    _partial: bytes = b""

    def note_stderr(self, chunk: bytes) -> None:
        text = self._partial + chunk
        *lines, rest = text.split(b"\n")
        self._partial = rest[-LINE_CHARS:]
        for line in lines:
            line = line.rstrip()
            if line:
                self.stderr.append(line[:LINE_CHARS].decode(errors="replace"))

    def note_malformed(self, line: bytes) -> None:
        self.malformed += 1
        self.last_malformed = line[:200].decode(errors="replace")

    def stderr_tail(self, lines: int = 5) -> str:
        return " | ".join(list(self.stderr)[-lines:])

    def describe(self) -> str:
        """What went wrong on this connection, in a clause ("" when nothing did)."""
        parts = []
        if self.problem:
            parts.append(self.problem)
        if self.exit_code is not None:
            parts.append(f"the server exited with code {self.exit_code}")
        if self.malformed:
            parts.append(
                f"it wrote {self.malformed} line(s) that are not JSON-RPC, the last: {self.last_malformed!r}"
            )
        if self.stderr and (self.exit_code is not None or self.problem):
            parts.append(f"its stderr ends: {self.stderr_tail()}")
        return "; ".join(parts)
