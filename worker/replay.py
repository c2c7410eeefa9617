"""Re-running a finished job's final program with its recorded tool results: no tool, no model.

The final attempt's tool calls come from the job's audit stream (``tool_call`` events); the bridge
serves each call from them (same order, same tool, same arguments, else the call fails), so the
program sees exactly what it saw the first time. A deterministic program must print the same RESULT.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sandfleet.core.config import SandboxConfig
from sandfleet.core.contracts import AuditEvent, JobResult, JobSpec, ToolCallRecord
from sandfleet.core.errors import InvalidSpecError
from sandfleet.worker.runtime import ProgramRuntime, RunResult
from sandfleet.worker.sandbox.pool import SandboxPool
from sandfleet.worker.tools.registry import ToolRegistry


@dataclass(frozen=True)
class ReplayOutcome:
    matches: bool
    recorded: Any
    replayed: Any
    run: RunResult

    def describe(self) -> str:
        if self.matches:
            return "match: the replayed program printed the recorded RESULT"
        return f"DIFFERENT: recorded RESULT {self.recorded!r}, replayed RESULT {self.replayed!r}" + (
            f" ({self.run.failure()})" if self.run.failure() else ""
        )


def recorded_calls(events: list[AuditEvent], attempt: int) -> list[ToolCallRecord]:
    """The tool calls of one attempt, in order, from the audit events."""
    return [
        ToolCallRecord.model_validate(e.data)
        for e in events
        if e.kind == "tool_call" and e.attempt == attempt
    ]


def placeholder_registry(names: list[str]) -> ToolRegistry:
    """Tools that exist by name only: in a replay, calls are answered from the record."""

    def make(name: str) -> Any:
        def tool(*args: Any, **kwargs: Any) -> Any:
            raise RuntimeError(f"replay never calls {name}")

        tool.__name__ = name
        tool.__doc__ = f"{name} (replayed from the audit record)"
        return tool

    return ToolRegistry.from_functions([make(n) for n in names])


def replay_job(
    spec: JobSpec, result: JobResult, events: list[AuditEvent], pool: SandboxPool
) -> ReplayOutcome:
    """Re-run ``result``'s final program in a fresh sandbox with its recorded tool results."""
    if not result.final_program or not result.attempts:
        raise InvalidSpecError(f"job {result.job_id} has no final program to replay ({result.status.value})")
    final = next(a for a in reversed(result.attempts) if a.program == result.final_program)
    calls = recorded_calls(events, final.number)
    tools = sorted({c.tool for c in calls} | set(spec.tools))
    runtime = ProgramRuntime(pool, placeholder_registry(tools))
    run = runtime.run(
        result.final_program,
        config=SandboxConfig.model_validate(spec.sandbox),
        settings=spec.code_action,
        tools=tools,
        job_id=result.job_id,
        replay=calls,
    )
    recorded = final.result if final.result_found else None
    return ReplayOutcome(
        matches=run.result_found and run.result == recorded,
        recorded=recorded,
        replayed=run.result if run.result_found else None,
        run=run,
    )
