"""Chat mode: the job's tools through a plain tool-calling loop, no sandbox. The baseline.

It is what code-action is measured against, so it must be honest: the same tools, the same data,
the same caps on calls, the same call policy, and a system prompt that asks for the same answer
format. The tools run on the worker host, as they do for code-action (the bridge serves them there);
no model-written code runs anywhere.
"""

from __future__ import annotations

from sandfleet.core.audit_sink import AuditSink
from sandfleet.core.contracts import JobResult, JobSpec
from sandfleet.worker.engine.admission import JobStart, admit
from sandfleet.worker.engine.functions import FunctionTable
from sandfleet.worker.engine.outcome import loop_result
from sandfleet.worker.engine.prompt import first_messages, tool_loop_system
from sandfleet.worker.engine.services import EngineServices
from sandfleet.worker.engine.toolloop import ToolLoop


def run_chat_job(
    spec: JobSpec, job_id: str, *, services: EngineServices, audit: AuditSink, base_url: str | None = None
) -> JobResult:
    """Answer one chat job. Returns its result for every outcome of the job itself.

    Raises:
        ModelUnavailableError: the model endpoint failed with a retryable error (the job is retried).
    """
    start = JobStart(spec, job_id, services, audit, base_url)
    admitted = admit(
        start,
        lambda config, allowed: FunctionTable(allowed, policy=services.runtime.policy, job_id=job_id),
        sandbox=False,  # no sandbox here, but its options are checked against the policy all the same
    )
    if isinstance(admitted, JobResult):
        return admitted
    system = tool_loop_system(shell=False, max_tool_calls=spec.tool_loop.max_tool_calls)
    messages = first_messages(spec.question, spec.history, system)
    loop = ToolLoop(
        admitted.model,
        admitted.prepared,
        spec.tool_loop,
        audit,
        request_timeout_s=services.settings.model_request_timeout_s,
        redact=tuple(services.settings.approval_redact),
    )
    outcome = loop.run(messages)
    return loop_result(start, outcome)
