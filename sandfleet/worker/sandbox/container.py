"""One live sandbox and the conversation with its agent, whatever backend runs it.

A backend (engine.DockerBackend) makes the sandbox, connects its stdin/stdout and calls ``boot``:
the agent is sent and says hello; from then on the host sends commands, files and tool replies,
and keeps every deadline itself. What the conversation cannot see (how a sandbox whose stream
closed ended; removing it) it asks of the backend's handle. ``destroy`` always removes the sandbox,
and logs rather than raises.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from sandfleet.core.config import SandboxConfig
from sandfleet.core.errors import SandboxError, SandboxUnavailableError
from sandfleet.core.vocabulary import Limit
from sandfleet.worker.sandbox.calls import OVERDUE_POLL_S, Call, CallConversation
from sandfleet.worker.sandbox.channel import (
    AgentChannel,
    BodyWatcher,
    ChannelClosedError,
    ChannelError,
    ChannelTimeoutError,
)
from sandfleet.worker.sandbox.docker.spec import agent_payload, command_env
from sandfleet.worker.sandbox.inside import protocol
from sandfleet.worker.sandbox.isolation import network_refusal

HELLO_TIMEOUT_S = 60.0
FILE_TIMEOUT_S = 60.0
KILL_GRACE_S = 1.0
DEFAULT_OUTPUT_CAP = 1024**2
MAX_FILE_BYTES = 256 * 1024**2
TOOL_SUBSTEP_S = 5.0
SIGKILL_EXIT = 128 + 9
SIGTERM_EXIT = 128 + 15  # how containers end when their engine stops (it sends SIGTERM first)
AGENT_KILLED = (
    "the program killed the sandbox's own agent process (its main process, which runs the program) "
    "with SIGKILL, and the sandbox ended with it: no limit was hit (neither the kernel's OOM killer "
    "nor anything outside the sandbox sent that signal); the program's output was lost"
)
KILLED_FROM_OUTSIDE = "the sandbox was killed from outside (docker kill, its removal, or the engine stopping)"

# (header, body, number) of one tool call from the program -> the JSON reply bytes to send back
# (None: the handler's ``overdue()`` answered it already); ``number``: the call's place in reading
# order. See sandfleet.worker.sandbox.calls.
CallHandler = Callable[[dict[str, Any], bytes, int], bytes | None]


@dataclass(frozen=True)
class SandboxEnd:
    """How a sandbox whose stream closed ended, as its backend saw it."""

    exit_code: int | None = None  # of its main process, the agent (128 + N: killed by signal N)
    oom_killed: bool = False  # by the kernel's OOM killer: the memory limit
    killed_from_outside: bool = False  # through its backend (killed, removed, the engine stopping)
    gone: bool = False  # the backend no longer knows it

    @property
    def agent_killed(self) -> bool:
        """The agent died of a SIGKILL that came from inside the sandbox: from the program."""
        return self.exit_code == SIGKILL_EXIT and not (self.oom_killed or self.killed_from_outside)


class SandboxHandle(Protocol):
    """One sandbox as its backend holds it: what the agent's channel cannot tell or do."""

    id: str
    runtime: str  # e.g. the Docker runtime (runc, runsc)

    def ended(self) -> SandboxEnd:
        """How it ended, once the stream closed. Raises SandboxUnavailableError: no engine."""
        ...

    def remove(self) -> None:
        """Kill and remove it. Never raises."""

    def inspect(self) -> dict[str, Any]:
        """The backend's own description of it (``docker inspect``)."""
        ...


@dataclass
class ExecResult:
    """What one command did. Output is capped per stream; the totals say how much there was."""

    stdout: str
    stderr: str
    exit_code: int
    timed_out: bool = False
    stdout_truncated: bool = False
    stderr_truncated: bool = False
    stdout_bytes: int = 0
    stderr_bytes: int = 0
    result_line: bytes | None = None
    result_overflow: bool = False
    stdout_end: str = ""  # the last ``tail`` bytes of each stream, when execute was asked for them
    stderr_end: str = ""
    oom_killed: bool = False
    duration_s: float = 0.0
    agent_run_s: float = 0.0
    forked: bool = False  # a Python program run in a fork of the agent (no new interpreter)
    survivors: int = 0
    agent_killed: bool = False  # the program killed the agent, which ended the sandbox
    killed_from_outside: bool = False  # through its backend: docker kill, removal, the engine stopping
    protocol_error: str | None = None
    limits_hit: list[Limit] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {
            "stdout": self.stdout,
            "stderr": self.stderr,
            "exit_code": self.exit_code,
            "timed_out": self.timed_out,
            "stdout_truncated": self.stdout_truncated,
            "stderr_truncated": self.stderr_truncated,
            "oom_killed": self.oom_killed,
        }


def exit_code_of(returncode: int) -> int:
    """A shell-style exit code: death by signal N is 128 + N (so an OOM kill is 137)."""
    return 128 - returncode if returncode < 0 else returncode


class SandboxContainer:
    """A started sandbox whose agent is waiting for work."""

    def __init__(
        self,
        config: SandboxConfig,
        handle: SandboxHandle,
        channel: AgentChannel,
        hello: dict[str, Any],
        start_s: float,
    ) -> None:
        self.config = config
        self.handle = handle
        self.channel = channel
        self.hello = hello
        self.start_s = start_s
        self.id = handle.id
        self.runtime = handle.runtime
        self.destroyed = False
        self.used = False

    # -- life cycle ---------------------------------------------------------------------------

    @classmethod
    def boot(
        cls, config: SandboxConfig, handle: SandboxHandle, channel: AgentChannel, began: float
    ) -> SandboxContainer:
        """Send the agent to a sandbox its backend just started, and wait for its hello.

        ``began`` is when the start began (time.monotonic()). On failure the caller (the backend)
        closes the channel and removes the sandbox.

        Raises:
            ChannelError: the sandbox went away or did not answer in time.
            SandboxError: the agent said something else, or could not install its syscall filter.
        """
        channel.send_raw(agent_payload())
        kind, hello, _ = channel.recv(time.monotonic() + HELLO_TIMEOUT_S, max_body=0)
        if kind != protocol.HELLO:
            raise SandboxError(f"the sandbox agent did not say hello (got {kind!r})")
        if not hello.get("syscall_filter"):
            raise SandboxError("the sandbox's syscall filter could not be installed; refusing to use it")
        if refusal := network_refusal(config, hello.get("network")):
            raise SandboxError(refusal)
        return cls(config, handle, channel, hello, time.monotonic() - began)

    def destroy(self) -> None:
        """Kill and remove the container. Never raises."""
        if self.destroyed:
            return
        self.destroyed = True
        self.channel.close()
        self.handle.remove()

    # -- commands -----------------------------------------------------------------------------

    def execute(
        self,
        argv: list[str],
        *,
        timeout: float | None = None,
        stdin: bytes = b"",
        env: dict[str, str] | None = None,
        cwd: str | None = None,
        max_output: int = DEFAULT_OUTPUT_CAP,
        max_result: int = 0,
        on_call: CallHandler | None = None,
        max_request: int = 1024**2,
        python_script: str | None = None,
        tail: int = 0,
        mkdirs: list[str] | None = None,
    ) -> ExecResult:
        """Run one command to completion (or its deadline) and return what it did.

        With ``tail`` the last ``tail`` bytes of each stream come back too (``stdout_end``,
        ``stderr_end``), besides the first ``max_output``: a shell session shows head and tail.

        With ``python_script`` (``argv`` being ``python3 -s`` of it) the agent may run the script
        in a fork of its own interpreter instead, when the environment would start Python the
        same way; the result says ``forked``. It behaves as ``argv`` would, for less CPU.

        ``mkdirs`` are folders the agent makes (as the sandbox's user) before the command starts.

        With ``on_call`` the command gets the tool bridge: each call is handed to ``on_call`` and
        its reply sent back, calls from the program's threads side by side (calls.py: the thread
        that reads a call serves it while another reads on). The deadline is enforced by the agent
        and, one second later, by the host, which then kills the container outright.
        """
        self.used = True
        began = time.monotonic()
        deadline = began + timeout if timeout else None
        self.channel.send(
            protocol.EXECUTE,
            {
                "argv": argv,
                "env": command_env(self.config) if env is None else env,
                "cwd": cwd or self.config.workdir,
                "timeout": timeout,
                "max_output": max_output,
                "max_result": max_result,
                "bridge": on_call is not None,
                "max_request": max_request,
                "python_script": python_script,
                "tail": tail,
                **({"mkdirs": mkdirs} if mkdirs else {}),
            },
            stdin,
        )
        max_body = 2 * max_output + 2 * tail + max_result + max_request + 1024
        frames = _CommandFrames(self, began, timeout, deadline, max_body, on_call)
        if on_call is None:
            while True:
                outcome = frames.step(busy=False)
                if isinstance(outcome, ExecResult):
                    return outcome
        conversation: CallConversation[ExecResult] = CallConversation(
            frames.step, on_call, lambda reply: self._send_quietly(protocol.TOOL_REPLY, {}, reply)
        )
        return conversation.run()

    def kill_command(self) -> None:
        """Tell the agent to kill the running command now (a job suspended to wait for an approval);
        the command then ends as killed and ``execute`` returns."""
        self._send_quietly(protocol.KILL, wait_s=KILL_GRACE_S)

    def _ended_early(
        self, began: float, timeout: float | None, deadline: float | None, why: str
    ) -> ExecResult:
        """The stream broke mid-command: how the sandbox ended, as its backend saw it.

        Raises:
            SandboxUnavailableError: the engine went away.
        """
        try:
            end = self.handle.ended()  # raises SandboxUnavailableError when the engine went away
        finally:
            self.destroy()
        if end.oom_killed:  # under gVisor the whole sandbox goes at once
            return ExecResult(
                stdout="",
                stderr="the sandbox ran out of memory and was killed",
                exit_code=SIGKILL_EXIT,
                oom_killed=True,
                limits_hit=[Limit.MEMORY],
                duration_s=time.monotonic() - began,
            )
        if end.agent_killed:  # possible under gVisor; under runc the agent is out of reach
            return ExecResult(
                stdout="",
                stderr=f"sandbox failure: {AGENT_KILLED}",
                exit_code=-1,
                agent_killed=True,
                duration_s=time.monotonic() - began,
                protocol_error=AGENT_KILLED,
            )
        if end.killed_from_outside:
            return ExecResult(
                stdout="",
                stderr=f"sandbox failure: {KILLED_FROM_OUTSIDE}",
                exit_code=-1,
                killed_from_outside=True,
                duration_s=time.monotonic() - began,
                protocol_error=KILLED_FROM_OUTSIDE,
            )
        return self._lost(began, timeout if deadline and time.monotonic() >= deadline else None, why)

    def _send_quietly(
        self,
        kind: bytes,
        header: dict[str, Any] | None = None,
        body: bytes = b"",
        wait_s: float | None = None,
    ) -> None:
        try:
            self.channel.send(kind, header, body, wait_s=wait_s)
        except ChannelClosedError:
            pass  # the next recv reports it

    def _finished(self, h: dict[str, Any], body: bytes, began: float, timeout: float | None) -> ExecResult:
        out_len, err_len, result_len = (
            int(h.get("out_len", 0)),
            int(h.get("err_len", 0)),
            int(h.get("result_len", 0)),
        )
        stdout = body[:out_len].decode(errors="replace")
        stderr = body[out_len : out_len + err_len].decode(errors="replace")
        result_line = body[out_len + err_len : out_len + err_len + result_len] or None
        ends = out_len + err_len + result_len
        out_tail_len, err_tail_len = int(h.get("out_tail_len", 0)), int(h.get("err_tail_len", 0))
        stdout_end = body[ends : ends + out_tail_len].decode(errors="replace")
        stderr_end = body[ends + out_tail_len : ends + out_tail_len + err_tail_len].decode(errors="replace")
        timed_out = bool(h.get("timed_out"))
        limits: list[Limit] = []
        code = exit_code_of(int(h.get("exit_code", -1)))
        if h.get("spawn_error"):
            stderr = f"cannot start the command: {h['spawn_error']}"
        if timed_out:
            code = -1
            stderr = _timeout_note(stderr, timeout)
            limits.append(Limit.TIMEOUT)
        if h.get("oom_killed"):
            limits.append(Limit.MEMORY)
        truncated_out = int(h.get("out_total", 0)) > out_len
        truncated_err = int(h.get("err_total", 0)) > err_len
        if truncated_out or truncated_err:
            limits.append(Limit.OUTPUT)
        return ExecResult(
            stdout=stdout,
            stderr=stderr,
            exit_code=code,
            timed_out=timed_out,
            stdout_truncated=truncated_out,
            stderr_truncated=truncated_err,
            stdout_bytes=int(h.get("out_total", 0)),
            stderr_bytes=int(h.get("err_total", 0)),
            result_line=result_line,
            result_overflow=bool(h.get("result_overflow")),
            stdout_end=stdout_end,
            stderr_end=stderr_end,
            oom_killed=bool(h.get("oom_killed")),
            duration_s=time.monotonic() - began,
            agent_run_s=float(h.get("run_s", 0.0)),
            forked=bool(h.get("forked")),
            survivors=int(h.get("survivors", 0)),
            limits_hit=limits,
        )

    def _lost(self, began: float, timeout: float | None, why: str) -> ExecResult:
        if timeout is not None:
            return ExecResult(
                stdout="",
                stderr=_timeout_note("", timeout),
                exit_code=-1,
                timed_out=True,
                duration_s=time.monotonic() - began,
                limits_hit=[Limit.TIMEOUT],
                protocol_error=why,
            )
        return ExecResult(
            stdout="",
            stderr=f"sandbox failure: {why}",
            exit_code=-1,
            duration_s=time.monotonic() - began,
            protocol_error=why,
        )

    # -- files (written from inside: Docker's archive API refuses read-only roots) ---------------

    def write_file(self, path: str, data: bytes | str, mode: int = 0o644) -> None:
        payload = data.encode() if isinstance(data, str) else data
        if len(payload) > MAX_FILE_BYTES:
            raise SandboxError(f"file of {len(payload)} bytes is larger than {MAX_FILE_BYTES}")
        self._ask(protocol.WRITE, {"path": self._abs(path), "mode": mode}, payload)

    def put_files(self, files: dict[str, bytes]) -> None:
        """Write several files in one round trip (frames pipelined, answers read afterwards)."""
        for path, data in files.items():
            self.channel.send(protocol.WRITE, {"path": self._abs(path), "mode": 0o644}, data)
        for path in files:
            try:
                kind, answer, _ = self.channel.recv(time.monotonic() + FILE_TIMEOUT_S, 1024)
            except ChannelError as e:
                raise self._not_answering(e) from e
            if kind != protocol.ANSWER or not answer.get("ok"):
                raise SandboxError(f"{path}: {answer.get('error', 'cannot write')}")

    def read_file(self, path: str, max_bytes: int = 64 * 1024**2) -> bytes:
        _, body = self._ask(
            protocol.READ, {"path": self._abs(path), "max_bytes": max_bytes}, max_body=max_bytes
        )
        return bytes(body)  # already bytes (no watcher): no copy

    def collect(
        self,
        path: str,
        *,
        max_file: int,
        max_total: int,
        max_files: int,
        max_depth: int,
        max_body: int,
        watcher: BodyWatcher | None = None,
    ) -> tuple[dict[str, Any], bytes | bytearray]:
        """The agent's answer to COLLECT for ``path`` (protocol.py): its header and body, unchecked
        (sandfleet/worker/program/artifacts.py checks them). ``max_body`` bounds what the host reads; ``watcher`` sees a
        large body as it arrives (channel.BodyWatcher)."""
        header = {
            "path": path,
            "max_file": max_file,
            "max_total": max_total,
            "max_files": max_files,
            "max_depth": max_depth,
        }
        return self._ask(protocol.COLLECT, header, max_body=max_body, watcher=watcher)

    def list_files(self, path: str | None = None) -> list[str]:
        header, _ = self._ask(protocol.LIST, {"path": self._abs(path or self.config.workdir)})
        return list(header.get("files", []))

    def _not_answering(self, e: ChannelError) -> SandboxError | SandboxUnavailableError:
        """The error for a sandbox that stopped answering a file request: transient when its engine
        went away or stopped it (an engine that stops takes its containers: the job is retried, as
        when a command's stream breaks), else SandboxError."""
        try:
            end = self.handle.ended()
        except SandboxUnavailableError as gone:
            return gone
        if end.gone or end.killed_from_outside or end.exit_code == SIGTERM_EXIT:
            return SandboxUnavailableError(f"the sandbox was stopped by its engine: {e}")
        return SandboxError(f"the sandbox did not answer: {e}")

    def _abs(self, path: str) -> str:
        return path if path.startswith("/") else f"{self.config.workdir.rstrip('/')}/{path}"

    def _ask(
        self,
        kind: bytes,
        header: dict[str, Any],
        body: bytes = b"",
        max_body: int = 1024,
        watcher: BodyWatcher | None = None,
    ) -> tuple[dict[str, Any], bytes | bytearray]:
        self.channel.send(kind, header, body)
        try:
            answer_kind, answer, data = self.channel.recv_watched(
                time.monotonic() + FILE_TIMEOUT_S, max_body, watcher
            )
        except ChannelError as e:
            raise self._not_answering(e) from e
        if answer_kind != protocol.ANSWER:
            raise SandboxError(f"unexpected answer from the sandbox: {answer_kind!r}")
        if not answer.get("ok"):
            raise SandboxError(f"{header.get('path', '')}: {answer.get('error', 'failed')}")
        return answer, data

    def inspect(self) -> dict[str, Any]:
        """The backend's own view of the sandbox (``docker inspect`` for Docker)."""
        return self.handle.inspect()


def _timeout_note(stderr: str, timeout: float | None) -> str:
    note = f"Command timed out after {timeout:g} seconds; its processes were killed"
    return f"{stderr.rstrip()}\n{note}" if stderr.strip() else note


class _CommandFrames:
    """The host's side of one running command, one frame at a time: deadlines kept, the kill sent,
    the sandbox destroyed when it does not stop, tool calls handed out (see calls.py)."""

    def __init__(
        self,
        container: SandboxContainer,
        began: float,
        timeout: float | None,
        deadline: float | None,
        max_body: int,
        on_call: CallHandler | None,
    ) -> None:
        self.container = container
        self.began, self.timeout, self.deadline, self.max_body = began, timeout, deadline, max_body
        self.hard_deadline = None if deadline is None else deadline + 3 * KILL_GRACE_S
        self.bridge = on_call is not None
        self.overdue: Callable[[], list[bytes]] | None = getattr(on_call, "overdue", None)
        self.kill_sent = False
        self.next_overdue = time.monotonic() + OVERDUE_POLL_S

    def step(self, busy: bool) -> ExecResult | Call | None:
        """Read one frame: the command's result when it ended, a tool call, or None (go on).

        Raises:
            SandboxUnavailableError: the channel broke because the engine went away.
        """
        c = self.container
        if self.overdue is not None and time.monotonic() >= self.next_overdue:
            for reply in self.overdue():  # calls past their timeout (even while frames keep coming)
                c._send_quietly(protocol.TOOL_REPLY, {}, reply)
            self.next_overdue = time.monotonic() + OVERDUE_POLL_S
        if self.hard_deadline is not None and time.monotonic() >= self.hard_deadline:
            # Frames keep coming (a program flooding the bridge) but never "done": the host's
            # deadline holds even when the channel never goes quiet long enough to time out.
            c.destroy()
            return c._lost(
                self.began, self.timeout, "the sandbox did not stop at its deadline and was destroyed"
            )
        deadline = self.deadline
        wait_until = None if deadline is None else deadline + (2 if self.kill_sent else 1) * KILL_GRACE_S
        poll_until = wait_until
        if busy and self.overdue is not None:  # wake for calls past their timeout
            poll_until = self.next_overdue if wait_until is None else min(wait_until, self.next_overdue)
        try:
            kind, header, body = c.channel.recv(poll_until, self.max_body)
        except ChannelTimeoutError:
            if poll_until != wait_until and (wait_until is None or time.monotonic() < wait_until):
                return None  # only the overdue check was due
            if not self.kill_sent:
                self.kill_sent = True
                c._send_quietly(protocol.KILL, wait_s=KILL_GRACE_S)
                return None
            c.destroy()
            return c._lost(
                self.began, self.timeout, "the sandbox did not stop at its deadline and was destroyed"
            )
        except ChannelError as e:
            return c._ended_early(self.began, self.timeout, deadline, str(e))
        if kind == protocol.DONE:
            return c._finished(header, body, self.began, self.timeout)
        if kind == protocol.CALL and self.bridge:
            return Call(header, body)
        if kind == protocol.ANSWER:
            return None  # a late answer to a command frame sent while busy
        c.destroy()
        return c._lost(self.began, None, f"the sandbox broke the protocol (frame {kind!r})")
