"""One row of ``sandfleet doctor`` (its own module: the doctor's check modules share it)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Check:
    """One row. ``required`` rows make the exit status non-zero when not ok."""

    check: str
    ok: bool
    detail: str
    fix: str = ""
    required: bool = True
