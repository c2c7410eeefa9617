"""Chat mode: the job's tools through a plain tool-calling loop, no sandbox. The baseline.

It is what code-action is measured against, so it must be honest: the same tools, the same data,
the same caps on calls, the same call policy, and a system prompt that asks for the same answer
format. The tools run on the worker host, as they do for code-action (the bridge serves them there);
no model-written code runs anywhere.

A call of a gated tool waits for a person as a program's does (loop_gate.py): after the grace the job
is suspended with its loop's checkpoint (nothing to save: chat holds no sandbox) and resumes on any
worker where it stopped, the approved call run once, a denial given to the model as the call's error.
"""

from __future__ import annotations

import time

from sandfleet.core.audit_sink import AuditSink
from sandfleet.core.contracts import JobResult, JobSpec
from sandfleet.worker.engine.admission import JobStart, admit
from sandfleet.worker.engine.functions import FunctionTable
from sandfleet.worker.engine.loop_gate import LoopSuspended
from sandfleet.worker.engine.loop_resume import loop_gate, note_resumed, resume_point, suspension
from sandfleet.worker.engine.outcome import loop_result
from sandfleet.worker.engine.prompt import first_messages, tool_loop_system
from sandfleet.worker.engine.services import EngineServices
from sandfleet.worker.engine.toolloop import LoopSetup, ToolLoop


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
    resume = resume_point(start)  # a suspended job's verified checkpoint: it goes on where it stopped
    if isinstance(resume, JobResult):
        return resume
    if resume is not None:
        assert resume.loop is not None
        note_resumed(start, resume)
        messages = list(resume.messages)
        deadline = time.monotonic() + max(0.0, spec.tool_loop.wall_timeout - resume.loop.elapsed_s)
    else:
        system = tool_loop_system(shell=False, max_tool_calls=spec.tool_loop.max_tool_calls)
        messages = first_messages(spec.question, spec.history, system)
        deadline = time.monotonic() + spec.tool_loop.wall_timeout
    loop = ToolLoop(
        admitted.model,
        admitted.prepared,
        spec.tool_loop,
        audit,
        LoopSetup(
            request_timeout_s=services.settings.model_request_timeout_s,
            redact=tuple(services.settings.approval_redact),
            gate=loop_gate(start, admitted.allowed),
        ),
    )
    try:
        outcome = loop.run(messages, deadline=deadline, resume=resume.loop if resume is not None else None)
    except LoopSuspended as e:  # a gated call waits for a person: the job waits in Redis (no sandbox here)
        raise suspension(start, e, resume) from None
    return loop_result(start, outcome)
