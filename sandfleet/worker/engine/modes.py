"""One job, answered in its mode: code-action (code_action.py), shell (shell/mode.py) or chat (chat.py).
Each mode admits the job first (admission.py)."""

from __future__ import annotations

from sandfleet.core.audit_sink import AuditSink
from sandfleet.core.contracts import JobMode, JobResult, JobSpec
from sandfleet.worker.engine.chat import run_chat_job
from sandfleet.worker.engine.code_action import run_job as run_code_action_job
from sandfleet.worker.engine.services import EngineServices
from sandfleet.worker.engine.shell.mode import run_shell_job

RUNNERS = {JobMode.CODE_ACTION: run_code_action_job, JobMode.SHELL: run_shell_job, JobMode.CHAT: run_chat_job}


def run_job(
    spec: JobSpec, job_id: str, *, services: EngineServices, audit: AuditSink, base_url: str | None = None
) -> JobResult:
    """Answer one job in its mode. Returns its result for every outcome of the job itself; raises only
    transient infrastructure errors (SandboxUnavailableError, ModelUnavailableError, and
    ToolServerUnavailableError: an MCP server whose tool the job names is down, checked first)."""
    services.require_tools(spec.tools)
    return RUNNERS[spec.mode](spec, job_id, services=services, audit=audit, base_url=base_url)
