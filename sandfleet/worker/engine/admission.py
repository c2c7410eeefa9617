"""Admitting a job, alike in every mode: the checks before its first model call or container.

    sandbox options -> operator policy -> the job's tools -> the mode's own checks -> model -> preflight

A job that fails any of them is refused (``refused`` in its record, one ``error`` audit event) and
nothing has run: no model call, no container. Chat jobs have no sandbox, but their options are
checked against the policy too, so a job is refused alike whatever its mode.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, TypeVar

from pydantic import ValidationError

from sandfleet.core.config import SandboxConfig
from sandfleet.core.contracts import JobResult, JobSpec
from sandfleet.core.errors import InvalidSpecError, SandboxError
from sandfleet.worker.approval.policy import approval_patterns, is_gated
from sandfleet.worker.engine.job_start import JobStart as JobStart
from sandfleet.worker.engine.outcome import refused
from sandfleet.worker.engine.services import EngineServices
from sandfleet.worker.llm.client import ModelClient
from sandfleet.worker.sandbox.policy import check_sandbox_policy
from sandfleet.worker.tools.registry import ToolRegistry

T = TypeVar("T")
# The mode's own checks, given the job's sandbox and tools: what the mode needs of them next (raises
# InvalidSpecError / SandboxError to refuse the job).
ModeCheck = Callable[[SandboxConfig, ToolRegistry], T]


@dataclass(frozen=True)
class Admitted(Generic[T]):
    """An admitted job: its sandbox, its tools, its model client and what its mode's check made."""

    config: SandboxConfig
    allowed: ToolRegistry
    model: ModelClient
    prepared: T


def admit(start: JobStart, check: ModeCheck[T], *, sandbox: bool = True) -> Admitted[T] | JobResult:
    """The job admitted, or its refusal record. ``sandbox``: the mode runs containers (preflight them)."""
    spec, services = start.spec, start.services
    try:
        config = spec.sandbox_config
        check_sandbox_policy(config, services.settings)
        allowed = services.registry.subset(spec.tools)
        check_approvals_possible(spec, allowed, services)
        prepared = check(config, allowed)
        model = services.job_model(spec, start.job_id, start.base_url)
        if sandbox:
            services.pool.backend.preflight(config)
    except (InvalidSpecError, SandboxError, ValidationError) as e:
        return refused(start, e)
    return Admitted(config, allowed, model, prepared)


def check_approvals_possible(spec: JobSpec, allowed: ToolRegistry, services: EngineServices) -> None:
    """Fail closed, in every mode: a job whose tools need approval runs only where approvals can be
    asked (a fleet) and a decision could be accepted (an approvers file, or unsigned decisions
    allowed). Read-only tools (MCP resource readers) are never gated."""
    patterns = approval_patterns(services.settings.approval_tools, spec.approval_tools)
    gated = [t.name for t in allowed if is_gated(t.name, patterns) and not t.read_only]
    if not gated:
        return
    tools = f"tool{'s' if len(gated) > 1 else ''} {', '.join(gated)} need a person's approval"
    if services.approvals is None:
        raise InvalidSpecError(
            f"{tools}, which needs the fleet (Redis and a worker); this process has no approval service"
        )
    if problem := services.approvals.decisions_problem():
        raise InvalidSpecError(f"{tools}, and {problem}")
