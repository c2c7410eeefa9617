"""Chat mode: the job's tools through a plain tool-calling loop, no sandbox. The baseline.

It is what code-action is measured against, so it must be honest: the same tools, the same data,
the same caps on calls, the same call policy, and a system prompt that asks for the same answer
format. The tools run on the worker host, as they do for code-action (the bridge serves them there);
no model-written code runs anywhere.
"""

from __future__ import annotations

import time

from pydantic import ValidationError

from sandfleet.core.config import SandboxConfig
from sandfleet.core.contracts import JobMode, JobResult, JobSpec
from sandfleet.core.errors import InvalidSpecError
from sandfleet.worker.engine.functions import FunctionTable
from sandfleet.worker.engine.outcome import loop_result, refused
from sandfleet.worker.engine.prompt import first_messages, tool_loop_system
from sandfleet.worker.engine.services import EngineServices
from sandfleet.worker.engine.toolloop import AuditSink, ToolLoop
from sandfleet.worker.sandbox.policy import check_sandbox_policy


def run_chat_job(
    spec: JobSpec, job_id: str, *, services: EngineServices, audit: AuditSink, base_url: str | None = None
) -> JobResult:
    """Answer one chat job. Returns its result for every outcome of the job itself.

    Raises:
        ModelUnavailableError: the model endpoint failed with a retryable error (the job is retried).
    """
    began = time.perf_counter()
    model_name = spec.model or services.settings.model
    try:
        # No sandbox here, but a job is refused alike in every mode: bad options, or beyond the policy.
        check_sandbox_policy(SandboxConfig.model_validate(spec.sandbox), services.settings)
        allowed = services.registry.subset(spec.tools)
        functions = FunctionTable(allowed, policy=services.runtime.policy, job_id=job_id)
        model = services.job_model(spec, job_id, base_url)
    except (InvalidSpecError, ValidationError) as e:
        return refused(job_id, JobMode.CHAT, model_name, e, began, audit)
    system = tool_loop_system(shell=False, max_tool_calls=spec.tool_loop.max_tool_calls)
    messages = first_messages(spec.question, spec.history, system)
    loop = ToolLoop(
        model, functions, spec.tool_loop, audit, request_timeout_s=services.settings.model_request_timeout_s
    )
    outcome = loop.run(messages)
    return loop_result(job_id, JobMode.CHAT, model_name, outcome, began, audit)
