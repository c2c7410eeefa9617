"""Shell mode: a tool-calling loop over the job's tools plus five tools on ONE session sandbox.

The session sandbox is made when the job starts and destroyed when it ends, whatever happens (its
caps, a model failure, an exception), with the same hardening and limits as every sandbox. Its
lifetime cap is the sandbox's ``timeout`` (bounded by the job's wall time), its idle cap
``tool_loop.idle_timeout``. A sandbox that dies mid-job is reported to the model by the tool that
found it gone (and by every later one); the job goes on to an answer or a cap, never hangs.

Files come back as from a code-action job: /workspace/out/ is made before the first tool call, and
whatever is under it when the loop ends (answered, failed, timed out) is collected before the session
is destroyed, under the job's artifact caps, then stored and audited (program/artifacts.py). A job
cancelled while it runs keeps none: the cancel destroys its session at once, as it destroys a running
program's sandbox; so does a session that ended early (a cap, its container died).

A call of a gated tool waits for a person as a program's does (engine/loop_gate.py): after the grace
the session's /workspace is saved as an archive in the artifact store (shell/workspace.py), the
session destroyed, and the job suspended with its loop's checkpoint, which holds the archive's SHA-256.
On resume (any worker) a fresh session is made, the archive is used only if its SHA-256 is the
verified checkpoint's, and is restored file by file (checked names, no links) before the loop goes on.
"""

from __future__ import annotations

import functools
import time
from dataclasses import dataclass

from sandfleet.core.audit_sink import AuditSink
from sandfleet.core.config import DATA_SCIENCE_IMAGE, SandboxConfig
from sandfleet.core.contracts import AuditKind, ErrorInfo, ErrorKind, JobResult, JobSpec, JobStatus
from sandfleet.core.errors import InvalidSpecError, SandboxError, UntrustedStateError
from sandfleet.core.settings import Settings
from sandfleet.worker.approval.checkpoint import Checkpoint, WorkspaceArchive, carry_refusals
from sandfleet.worker.engine.admission import Admitted, JobStart, admit
from sandfleet.worker.engine.functions import FunctionTable
from sandfleet.worker.engine.loop_gate import LoopSuspended
from sandfleet.worker.engine.loop_resume import loop_gate, note_resumed, resume_point, suspension, untrusted
from sandfleet.worker.engine.outcome import failed_before_loop, loop_result
from sandfleet.worker.engine.prompt import first_messages, tool_loop_system
from sandfleet.worker.engine.schemas import function_tools
from sandfleet.worker.engine.services import EngineServices
from sandfleet.worker.engine.shell.session import SessionGoneError, SessionSandbox
from sandfleet.worker.engine.shell.tools import SHELL_TOOL_NAMES, PackageSources, ShellTools
from sandfleet.worker.engine.shell.workspace import (
    WorkspaceError,
    restore_workspace,
    resume_note,
    save_workspace,
)
from sandfleet.worker.engine.toolloop import LoopOutcome, LoopSetup, ToolLoop
from sandfleet.worker.program.artifacts import ArtifactCaps, out_dir
from sandfleet.worker.tools.registry import ToolRegistry


def run_shell_job(
    spec: JobSpec, job_id: str, *, services: EngineServices, audit: AuditSink, base_url: str | None = None
) -> JobResult:
    """Answer one shell job in a session sandbox of its own. Returns its result for every outcome of
    the job itself.

    Raises:
        SandboxUnavailableError: no engine (the job is retried).
        ModelUnavailableError: the model endpoint failed with a retryable error (the job is retried).
        JobSuspended: a gated call waits for a person (its /workspace saved, the session destroyed).
    """
    start = JobStart(spec, job_id, services, audit, base_url)
    admitted = admit(start, functools.partial(_shell_checks, services.settings, spec))
    if isinstance(admitted, JobResult):
        return admitted
    resume = resume_point(start)  # a suspended job's verified checkpoint: before any sandbox
    if isinstance(resume, JobResult):
        return resume
    caps = spec.tool_loop
    left = max(0.0, caps.wall_timeout - (resume.loop.elapsed_s if resume and resume.loop else 0.0))
    deadline = time.monotonic() + left
    session = _open_session(start, admitted, left)
    if isinstance(session, JobResult):
        return session
    config = admitted.config
    files = admitted.prepared
    collected, collect_s = None, 0.0
    try:
        resumed = None
        if resume is not None:
            restored = _restore(start, session, resume)
            if isinstance(restored, JobResult):
                return restored
            resumed = _Resumed(resume, note=restored)
        if files.enabled:
            session.make_folders([out_dir(config.workdir)])
        try:
            outcome = _converse(start, admitted, session, deadline, resumed)
        except LoopSuspended as e:  # a gated call waits: save /workspace, then no container is kept
            saved = _save(start, session, e)
            if not isinstance(saved, LoopOutcome):
                services.sessions.close_session(session)  # its last refusals taken before the checkpoint
                raise suspension(start, e, resume, saved, session.record()) from None
            outcome = saved
        began = time.perf_counter()
        collected = session.collect(files)  # before the session goes, whatever the loop's outcome
        collect_s = time.perf_counter() - began
    finally:
        services.sessions.close_session(session)
        record = session.record()  # this session's own: its destroyed event
        audit.emit(AuditKind.SESSION, {"event": "destroyed", **record.model_dump(mode="json")})
    return loop_result(
        start,
        outcome,
        session=carry_refusals(resume.loop if resume is not None else None, record),
        timings={"session_start_s": session.container.start_s, "artifacts_s": collect_s},
        collected=collected,
    )


def _open_session(
    start: JobStart, admitted: Admitted[ArtifactCaps], left: float
) -> SessionSandbox | JobResult:
    """The job's session sandbox, its ``started`` event written; a failed result when none can be made."""
    config = admitted.config
    try:
        session = start.services.sessions.open(
            config,
            job_id=start.job_id,
            lifetime_s=min(config.timeout, left),
            idle_s=start.spec.tool_loop.idle_timeout,
            wait_s=left,
        )
    except SandboxError as e:
        message = f"the session sandbox could not be made: {e}"
        return failed_before_loop(start, ErrorKind.SANDBOX, message)
    start.audit.emit(
        AuditKind.SESSION,
        {
            "event": "started",
            "container_id": session.container.id,
            "runtime": session.container.runtime,
            "start_s": session.container.start_s,
            "lifetime_s": session.seconds_left(),
            "idle_s": start.spec.tool_loop.idle_timeout,
        },
    )
    return session


def _restore(start: JobStart, session: SessionSandbox, resume: Checkpoint) -> JobResult | str:
    """Put the suspended job's /workspace back into the fresh session: the note telling the model what
    was not restored, or the untrusted_state record when the saved archive is not the one the verified
    checkpoint names (or breaks a rule)."""
    note_resumed(start, resume)
    loop = resume.loop
    assert loop is not None
    if loop.workspace is None:
        return untrusted(start, "the suspended shell job's checkpoint names no saved /workspace; not resumed")
    began = time.perf_counter()
    try:
        contents = restore_workspace(
            session,
            loop.workspace,
            start.services.artifacts,
            start.job_id,
            max_bytes=start.services.settings.approval_workspace_max_bytes,
        )
    except UntrustedStateError as e:
        return untrusted(start, str(e))
    start.audit.emit(
        AuditKind.SESSION,
        {
            "event": "restored",
            "workspace_sha256": loop.workspace.sha256,
            "bytes": loop.workspace.size,
            "files": len(contents.files),
            "folders": len(contents.folders),
            "links": len(contents.links),
            "skipped": contents.skipped,
            "restore_s": round(time.perf_counter() - began, 4),
        },
        resume.number,
    )
    return resume_note(contents)


def _save(
    start: JobStart, session: SessionSandbox, suspended: LoopSuspended
) -> WorkspaceArchive | LoopOutcome:
    """The session's /workspace saved for the wait (its ``saved`` event); when it cannot be, the loop's
    outcome ending the job failed, saying why (no container is kept for a person's decision)."""
    began = time.perf_counter()
    try:
        saved = save_workspace(
            session,
            start.services.artifacts,
            start.job_id,
            max_bytes=start.services.settings.approval_workspace_max_bytes,
        )
    except (WorkspaceError, SessionGoneError) as e:
        state = suspended.state
        message = f"the job waits for a person's approval, but its /workspace cannot be saved meanwhile: {e}"
        return LoopOutcome(
            status=JobStatus.FAILED,
            error=ErrorInfo(kind=ErrorKind.SANDBOX, message=message),
            turns=state.turns,
            usage=state.usage,
            limits_hit=list(state.limits_hit),
            tool_calls=state.tool_calls,
            model_s=state.model_s,
            tool_s=state.tool_s,
        )
    start.audit.emit(
        AuditKind.SESSION,
        {
            "event": "saved",
            "workspace_sha256": saved.sha256,
            "bytes": saved.size,
            "files": saved.files,
            "skipped": saved.skipped,
            "save_s": round(time.perf_counter() - began, 4),
        },
        suspended.state.turn,
    )
    return saved


def _shell_checks(
    settings: Settings, spec: JobSpec, config: SandboxConfig, allowed: ToolRegistry
) -> ArtifactCaps:
    """Shell mode's own admission: the job's tools beside the five sandbox tools, each offered by name;
    the artifact caps within the operator's, as for code-action."""
    _no_clash(allowed)
    return ArtifactCaps.for_job(settings, spec.artifacts)


def _no_clash(allowed: ToolRegistry) -> None:
    """The job's tools beside the five sandbox tools, each offered by name."""
    clash = sorted(set(allowed.names()) & set(SHELL_TOOL_NAMES))
    if clash:
        raise InvalidSpecError(
            f"tool {', '.join(clash)} has the name of a shell-mode sandbox tool; rename it for shell jobs"
        )
    function_tools(allowed)  # every job tool can be offered by name


@dataclass(frozen=True)
class _Resumed:
    """Where a resumed shell job's loop starts: its verified checkpoint, and what the model is told its
    fresh session lacks (``note``: what was not restored into /workspace)."""

    checkpoint: Checkpoint
    note: str


def _converse(
    start: JobStart,
    admitted: Admitted[ArtifactCaps],
    session: SessionSandbox,
    deadline: float,
    resumed: _Resumed | None = None,
) -> LoopOutcome:
    """The tool-calling loop of the job over its tools and the session's five."""
    resume, note = (resumed.checkpoint, resumed.note) if resumed is not None else (None, "")
    services, spec, config, caps = start.services, start.spec, admitted.config, start.spec.tool_loop
    tools = ShellTools(
        session,
        caps=caps,
        settings=services.settings,
        deadline=deadline,
        sources=PackageSources(config.network, services.sessions.wheelhouse),
    )
    shell_tools = tools.registry()
    functions = FunctionTable(
        ToolRegistry([*admitted.allowed, *shell_tools]),
        policy=services.runtime.policy,
        job_id=start.job_id,
        unchecked=shell_tools.names(),
    )
    system = tool_loop_system(
        shell=True,
        max_tool_calls=caps.max_tool_calls,
        data_science=config.image == DATA_SCIENCE_IMAGE,
        network=config.network,
    )
    messages = (
        list(resume.messages) if resume is not None else first_messages(spec.question, spec.history, system)
    )
    loop = ToolLoop(
        admitted.model,
        functions,
        caps,
        start.audit,
        LoopSetup(
            request_timeout_s=services.settings.model_request_timeout_s,
            redact=tuple(services.settings.approval_redact),
            gate=loop_gate(start, admitted.allowed),  # the job's tools only: the sandbox's are never gated
            resume_note=note,
        ),
    )
    return loop.run(messages, deadline=deadline, resume=resume.loop if resume is not None else None)
