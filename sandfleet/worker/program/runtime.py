"""The program runtime: run ONE model-written program in a fresh sandbox, tools served from the host.

    runtime = ProgramRuntime(pool, registry)
    run = runtime.run(program, config=SandboxConfig(), settings=CodeActionSettings(), tools=["load_orders"])
    run.result  # the RESULT payload

Each run takes a fresh container from the pool (warm when possible, never reused), writes the
program and a ``sandfleet_tools`` module allowing exactly the job's tools, runs it under
``exec_timeout`` with the bridge attached, collects the files it left in ``/workspace/out/``
(sandfleet/worker/program/artifacts.py), and returns what happened. The container is destroyed afterwards, whatever
happened.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from sandfleet.core import json_limits
from sandfleet.core.config import CodeActionSettings, SandboxConfig
from sandfleet.core.errors import InvalidSpecError, JsonLimitError
from sandfleet.core.run_models import ToolCallRecord
from sandfleet.core.vocabulary import Limit
from sandfleet.worker.cancel.scope import raise_if_cancelled, track_container
from sandfleet.worker.egress.refusals import Refusals, take_refusals
from sandfleet.worker.program.artifacts import ArtifactCaps, Collection, collect_artifacts, out_dir
from sandfleet.worker.program.bridge import BridgeLimits, CallPolicy, ToolBridge, allow_all, stub_module
from sandfleet.worker.program.recorded import RecordedAnswers
from sandfleet.worker.sandbox.pool import SandboxPool
from sandfleet.worker.tools.registry import ToolRegistry

log = logging.getLogger("sandfleet.runtime")

RESULT_PREFIX = "RESULT:"
BRIDGE_DIR = ".sandfleet"


def parse_result_line(line: bytes | str | None) -> tuple[bool, Any]:
    """(found, payload) from the last ``RESULT:`` line: JSON when it parses, else the text.

    Raises:
        JsonLimitError: the payload nests past the cap (``MAX_JSON_DEPTH``; checked before it is
            parsed). Text opening with a bracket that is not JSON but nests past the cap counts too.
    """
    if line is None:
        return False, None
    text = line.decode(errors="replace") if isinstance(line, bytes) else line
    if not text.startswith(RESULT_PREFIX):
        return False, None
    payload = text[len(RESULT_PREFIX) :].strip()
    try:  # JSON that opens with no bracket is a scalar (or no JSON): nothing for the cap to check
        return True, json_limits.loads(payload, "the RESULT") if payload[:1] in ("[", "{") else json.loads(
            payload
        )
    except JsonLimitError:
        raise
    except ValueError:
        return True, payload


@dataclass
class RunResult:
    """Everything one program run did, for the engine, the audit and the CLI."""

    exit_code: int
    timed_out: bool
    stdout: str
    stderr: str
    stdout_truncated: bool = False
    stderr_truncated: bool = False
    result_found: bool = False
    result: Any = None
    result_text: str | None = None
    tool_calls: list[ToolCallRecord] = field(default_factory=list)
    limits_hit: list[Limit] = field(default_factory=list)
    network_denied: list[dict[str, Any]] = field(default_factory=list)  # refused by proxy or filter
    refused_total: int = 0  # every refusal: network_denied's counts and the filter's past its log rate
    refused_unlisted: int = 0  # of which network_denied does not itemise
    oom_killed: bool = False
    agent_killed: bool = False  # the program killed its sandbox's agent process (not a limit)
    error: str | None = None
    container_id: str | None = None
    runtime: str | None = None
    warm: bool = False
    forked: bool = False  # run in a fork of the sandbox agent's interpreter, not a new python3
    timings: dict[str, float] = field(default_factory=dict)
    artifacts: Collection = field(default_factory=Collection)  # what it left in /workspace/out/
    suspended_for: list[str] = field(default_factory=list)  # stopped to wait for these approval requests
    untrusted_state: str | None = None  # stopped: a stored outcome the job's chain does not commit to

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and not self.timed_out and self.result_found and self.error is None

    def failure(self) -> str | None:
        """Why the run does not count as an answer, in words the model can act on; None if it does."""
        if self.timed_out:
            return f"the program timed out (killed at {self.timings.get('exec_timeout_s', 0):g} s)"
        if self.error:
            return self.error
        if Limit.TOOL_CALLS in self.limits_hit and self.exit_code != 0:
            return f"the program exceeded its tool-call budget and exited with code {self.exit_code}"
        if self.oom_killed or (self.exit_code == 137 and Limit.MEMORY in self.limits_hit):
            return "the program ran out of memory (exit code 137)"
        if self.exit_code != 0:
            return f"the program exited with code {self.exit_code}"
        if not self.result_found:
            return "the program printed no line starting with 'RESULT:'"
        return None

    def to_dict(self) -> dict[str, Any]:
        data = {k: v for k, v in self.__dict__.items() if k not in ("tool_calls", "artifacts")}
        data["tool_calls"] = [c.model_dump(mode="json") for c in self.tool_calls]
        data["artifacts"] = [a.info.model_dump(mode="json") for a in self.artifacts.kept]
        data["artifacts_skipped"] = [s.model_dump(mode="json") for s in self.artifacts.skipped]
        return data


class ProgramRuntime:
    """Runs programs in fresh sandboxes from ``pool`` with ``registry``'s tools on the host."""

    def __init__(
        self, pool: SandboxPool, registry: ToolRegistry | None = None, policy: CallPolicy = allow_all
    ) -> None:
        self.pool = pool
        self.registry = registry or ToolRegistry()
        self.policy = policy

    def run(
        self,
        program: str,
        *,
        config: SandboxConfig | None = None,
        settings: CodeActionSettings | None = None,
        tools: list[str] | None = None,
        registry: ToolRegistry | None = None,
        job_id: str | None = None,
        recorded: RecordedAnswers | None = None,
        on_call: Callable[[ToolCallRecord], None] | None = None,
        artifacts: ArtifactCaps | None = None,
        gate: Any = None,
        redact: tuple[str, ...] = (),
    ) -> RunResult:
        """Run ``program`` once. Raises only for infrastructure (SandboxError, SandboxUnavailableError)
        or a bad request (InvalidSpecError); whatever the program does is in the RunResult.

        ``recorded`` (sandfleet/worker/program/recorded.py) answers calls from records instead of the
        tools: all of them (a replay), the calls a suspended run had completed (a resume), repeated
        calls of side-effecting tools from an earlier attempt (the memo).
        ``artifacts``: the caps on the files collected from ``/workspace/out/`` (default: the defaults
        of the settings; ``max_files=0`` collects nothing).
        ``gate`` (sandfleet/worker/approval/gate.py) is asked before each gated call; a call still undecided after
        the grace stops the program (``suspended_for`` says for which requests).
        ``redact``: argument fields the call records show as ``***`` (sandfleet/core/redaction.py).
        ``registry``: the job's own tools, as it was admitted with them (MCP servers change their
        tools; a job keeps its set); by default this runtime's registry, narrowed to ``tools``.
        """
        config = config or SandboxConfig()
        settings = settings or CodeActionSettings()
        if config.persistent:
            raise InvalidSpecError("programs run in single-use sandboxes: persistent is not allowed here")
        source = registry if registry is not None else self.registry
        allowed = source.subset(tools if tools is not None else source.names())
        bridge = ToolBridge(
            allowed,
            BridgeLimits.of(settings),
            policy=self.policy,
            job_id=job_id,
            recorded=recorded,
            on_call=on_call,
            gate=gate,
            redact=tuple(redact),
        )
        sandbox = _Sandbox(config, settings, artifacts or ArtifactCaps())
        raise_if_cancelled("the program's run")
        return sandbox.result(self._in_sandbox(program, sandbox, bridge), bridge)

    def _in_sandbox(self, program: str, sandbox: _Sandbox, bridge: ToolBridge) -> _Ran:
        """Lease a fresh container, run the program in it with the bridge attached, collect its files;
        the container is released (destroyed) whatever happens."""
        config, settings = sandbox.config, sandbox.settings
        began = time.monotonic()
        lease = self.pool.acquire(config)
        container = lease.container
        untrack = track_container(container)  # a cancel of the job destroys it mid-run
        bridge.on_suspend = container.kill_command
        try:
            files_began = time.monotonic()
            base = f"{config.workdir.rstrip('/')}/{BRIDGE_DIR}"
            container.put_files(
                {
                    f"{base}/sandfleet_tools.py": stub_module(
                        bridge.registry, settings.max_request_bytes
                    ).encode(),
                    f"{base}/program.py": program.encode(),
                }
            )
            exec_began = time.monotonic()
            done = container.execute(
                ["python3", "-s", f"{base}/program.py"],
                python_script=f"{base}/program.py",
                timeout=sandbox.exec_timeout_s,
                max_output=settings.max_output_bytes,
                max_result=settings.max_response_bytes,
                on_call=bridge,
                max_request=settings.max_request_bytes,
                mkdirs=[out_dir(config.workdir)] if sandbox.caps.enabled else None,
            )
            ended = time.monotonic()
            refusals = take_refusals(container)  # before release: a released sandbox's are gone
            collection = collect_artifacts(container, sandbox.caps)
            collected = time.monotonic()
        finally:
            untrack()
            bridge.close()
            self.pool.release(container)
        marks = {
            "began": began,
            "files": files_began,
            "exec": exec_began,
            "ended": ended,
            "collected": collected,
        }
        return _Ran(lease, done, refusals, collection, marks)


@dataclass(frozen=True)
class _Ran:
    """What one run in a container left: the lease, the agent's report, denials, files, time marks."""

    lease: Any  # sandfleet/worker/sandbox/pool.py Lease
    done: Any  # the container's ExecResult
    refusals: Refusals
    collection: Collection
    marks: dict[str, float]  # time.monotonic() at each step


@dataclass(frozen=True)
class _Sandbox:
    """The sandbox one program runs in: its options, the run's settings, the artifact caps."""

    config: SandboxConfig
    settings: CodeActionSettings
    caps: ArtifactCaps

    @property
    def exec_timeout_s(self) -> float:
        return min(self.settings.exec_timeout, self.config.timeout)  # the sandbox's own timeout bounds it too

    def result(self, ran: _Ran, bridge: ToolBridge) -> RunResult:
        """The RunResult of a run: its answer (the RESULT line), its limits hit, its error, its timings."""
        done, settings = ran.done, self.settings
        limits = list(done.limits_hit)
        try:
            found, payload = parse_result_line(done.result_line)
            refused = None
        except JsonLimitError as e:  # the run's answer is refused, naming the cap: no value recorded
            found, payload, refused = True, None, str(e)
            limits.append(Limit.NESTING)
        for hit, limit in (
            (bridge.tally.budget_exceeded, Limit.TOOL_CALLS),
            (done.result_overflow, Limit.RESULT_SIZE),
            (ran.refusals.total > 0, Limit.NETWORK),
            (ran.collection.cap_hit, Limit.ARTIFACTS),
        ):
            if hit:
                limits.append(limit)
        error = done.protocol_error if not done.timed_out else None
        if done.result_overflow and error is None:
            error = f"the RESULT line is longer than the {settings.max_response_bytes}-byte limit"
        if refused and error is None:
            error = refused
        return RunResult(
            exit_code=done.exit_code,
            timed_out=done.timed_out,
            stdout=done.stdout,
            stderr=done.stderr,
            stdout_truncated=done.stdout_truncated,
            stderr_truncated=done.stderr_truncated,
            result_found=found,
            result=payload,
            result_text=done.result_line.decode(errors="replace")[len(RESULT_PREFIX) :].strip()
            if found and done.result_line is not None and refused is None
            else None,
            tool_calls=sorted(
                bridge.tally.records, key=lambda record: record.seq
            ),  # a copy, in arrival order
            limits_hit=limits,
            network_denied=ran.refusals.denials,
            refused_total=ran.refusals.total,
            refused_unlisted=ran.refusals.unlisted,
            oom_killed=done.oom_killed,
            agent_killed=done.agent_killed,
            error=error,
            container_id=ran.lease.container.id,
            runtime=ran.lease.container.runtime,
            warm=ran.lease.warm,
            forked=done.forked,
            artifacts=ran.collection,
            timings=self._timings(ran, bridge),
            suspended_for=list(bridge.tally.suspended_for),
            untrusted_state=bridge.tally.untrusted,
        )

    def _timings(self, ran: _Ran, bridge: ToolBridge) -> dict[str, float]:
        done, marks = ran.done, ran.marks
        return {
            "acquire_s": ran.lease.acquire_s,
            "files_s": marks["exec"] - marks["files"],
            "start_s": max(0.0, done.duration_s - done.agent_run_s),
            "run_s": done.agent_run_s,
            "tool_s": bridge.tally.tool_time_s,
            "total_s": marks["ended"] - marks["began"],
            "artifacts_s": marks["collected"] - marks["ended"],
            "exec_timeout_s": self.exec_timeout_s,
        }
