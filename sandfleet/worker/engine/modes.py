"""One job, answered in its mode: code-action (loop.py), shell (shell.py) or chat (chat.py)."""

from __future__ import annotations

import time

from sandfleet.core.contracts import JobMode, JobResult, JobSpec
from sandfleet.core.errors import InvalidSpecError
from sandfleet.worker.approval.policy import approval_patterns, is_gated
from sandfleet.worker.engine.chat import run_chat_job
from sandfleet.worker.engine.code_action import run_job as run_code_action_job
from sandfleet.worker.engine.outcome import refused
from sandfleet.worker.engine.services import EngineServices
from sandfleet.worker.engine.shell.mode import run_shell_job
from sandfleet.worker.engine.toolloop import AuditSink

RUNNERS = {JobMode.CODE_ACTION: run_code_action_job, JobMode.SHELL: run_shell_job, JobMode.CHAT: run_chat_job}


def run_job(
    spec: JobSpec, job_id: str, *, services: EngineServices, audit: AuditSink, base_url: str | None = None
) -> JobResult:
    """Answer one job in its mode. Returns its result for every outcome of the job itself; raises only
    transient infrastructure errors (SandboxUnavailableError, ModelUnavailableError, and
    ToolServerUnavailableError: an MCP server whose tool the job names is down, checked first)."""
    services.require_tools(spec.tools)
    if spec.mode.uses_tool_loop:
        gated = gated_tools(spec, services)
        if gated:  # fail closed: the tool-calling loop has no suspension point (yet)
            message = (
                f"tool{'s' if len(gated) > 1 else ''} {', '.join(gated)} need a person's approval, which "
                f"only code-action jobs support; {spec.mode.value} jobs cannot name them"
            )
            return refused(
                job_id,
                spec.mode,
                spec.model or services.settings.model,
                InvalidSpecError(message),
                time.perf_counter(),
                audit,
            )
    return RUNNERS[spec.mode](spec, job_id, services=services, audit=audit, base_url=base_url)


def gated_tools(spec: JobSpec, services: EngineServices) -> list[str]:
    """The job's tools that need approval under the worker's and the job's patterns."""
    patterns = approval_patterns(services.settings.approval_tools, spec.approval_tools)
    return [name for name in spec.tools if is_gated(name, patterns)]
