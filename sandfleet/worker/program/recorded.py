"""Recorded answers: calls the bridge serves from a record instead of running the tool.

One idea with three sources, asked in this order for each call ("is there a recorded answer for
call N?"):

- **replay** (re-running a finished job, sandfleet/worker/rerun/): every call comes from the
  original run's records; a call with no record is answered ``LookupError`` (the run differs).
- **resume** (a job suspended for an approval, going on): the calls the stopped run had completed
  are served again from its checkpoint, not audited a second time.
- **memo** (a repaired program, sandfleet/worker/engine/code_action.py): a side-effecting call
  already made with the same arguments by an earlier attempt is served that attempt's result; each
  earlier call stands in for one repeat, no more. Keyed by the call's digest (:func:`call_digest`),
  so a checkpoint holding the memo holds no argument.

A record is matched by the call's number, else by the first not yet served with the same tool and
arguments (by digest when some arguments of the record are redacted): calls made from several
threads may arrive in another order than they did.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from sandfleet.core.chain import sha256_hex
from sandfleet.core.run_models import ToolCallRecord


@dataclass(frozen=True)
class RecordedAnswer:
    """What the bridge answers a call with, from a record: a value, or an error to raise."""

    ok: bool
    value: Any = None
    error_type: str | None = None
    error: str | None = None
    replayed: bool = True  # the call's record says ``replayed`` (a resumed call keeps its own flag)
    quiet: bool = False  # audited once already (a resumed call): not reported again
    approval_id: str | None = None  # the approval the recorded call ran under

    @classmethod
    def of(cls, record: ToolCallRecord, *, replayed: bool, quiet: bool = False) -> RecordedAnswer:
        return cls(
            ok=record.ok,
            value=record.result,
            error_type=None if record.ok else record.error_type or "ToolError",
            error=None if record.ok else record.error or "failed",
            replayed=replayed,
            quiet=quiet,
            approval_id=record.approval_id if quiet else None,
        )


class RecordedAnswers:
    """The recorded answers of one program run (replay, resume, memo: any may be None). Thread-safe."""

    def __init__(
        self,
        *,
        replay: list[ToolCallRecord] | None = None,
        resume: list[ToolCallRecord] | None = None,
        memo: dict[str, list[Any]] | None = None,
    ) -> None:
        self.replay, self.resume = replay, resume
        self.memo = {key: list(results) for key, results in (memo or {}).items()}
        self._served: dict[str, set[int]] = {"replay": set(), "resume": set()}  # record seqs served
        self._lock = threading.Lock()

    @property
    def replaying(self) -> bool:
        """Every call comes from the record (nothing runs, nothing waits for a person)."""
        return self.replay is not None

    def answer(
        self,
        seq: int,
        tool: str,
        args: list[Any],
        kwargs: dict[str, Any],
        side_effects: Callable[[str], bool],
    ) -> RecordedAnswer | None:
        """The recorded answer for call ``seq``, or None: the call runs. ``side_effects(tool)``: whether
        the tool is marked ``@side_effects`` (only those are served from the memo)."""
        if self.replay is not None:
            record = self._match("replay", seq, tool, args, kwargs)
            if record is None:
                message = f"replay: call {seq} ({tool}) differs from the recorded run"
                return RecordedAnswer(ok=False, error_type="LookupError", error=message)
            return RecordedAnswer.of(record, replayed=True)
        if self.resume:
            record = self._match("resume", seq, tool, args, kwargs)
            if record is not None:  # the same call, as it was recorded before the suspension
                return RecordedAnswer.of(record, replayed=record.replayed, quiet=True)
        if self.memo and side_effects(tool):
            with self._lock:
                earlier = self.memo.get(call_digest(tool, args, kwargs))
                if earlier:
                    return RecordedAnswer(ok=True, value=earlier.pop(0))
        return None

    def _match(
        self, source: str, seq: int, tool: str, args: list[Any], kwargs: dict[str, Any]
    ) -> ToolCallRecord | None:
        """The record of ``source`` for this call, not yet served: the one numbered ``seq``, else the first alike."""
        records = (self.replay if source == "replay" else self.resume) or []
        with self._lock:
            served = self._served[source]
            same = [r for r in records if r.seq not in served and same_call(r, tool, args, kwargs)]
            record = next((r for r in same if r.seq == seq), same[0] if same else None)
            if record is not None:
                served.add(record.seq)
            return record


def call_key(tool: str, args: list[Any], kwargs: dict[str, Any]) -> str:
    """A canonical text of a call, to recognise the same call made again."""
    return json.dumps([tool, args, kwargs], sort_keys=True, separators=(",", ":"))


def call_digest(tool: str, args: list[Any], kwargs: dict[str, Any]) -> str:
    """The SHA-256 of :func:`call_key`: a call's record keeps it (its redacted values included), an
    approval binds it, and the memo of side-effecting calls is keyed by it (no argument in a key)."""
    return sha256_hex(call_key(tool, args, kwargs))


def same_call(record: ToolCallRecord, tool: str, args: list[Any], kwargs: dict[str, Any]) -> bool:
    """Whether ``record`` is of this call: by its arguments, or by its digest when some were redacted
    (the record shows ``***`` for them)."""
    if record.tool != tool:
        return False
    if record.redacted:
        return record.call_sha256 is not None and record.call_sha256 == call_digest(tool, args, kwargs)
    return record.args == args and record.kwargs == kwargs
