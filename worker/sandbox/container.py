"""One live sandbox container and the conversation with its agent.

A container is created locked down (see spec.py), attached, started, and handed the agent, which
says hello; from then on the host sends commands, files and tool replies, and keeps every deadline
itself. ``destroy`` always removes the container, and logs rather than raises.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from sandfleet.core.config import SandboxConfig
from sandfleet.core.errors import SandboxError
from sandfleet.core.vocabulary import Limit
from sandfleet.worker.sandbox import engine
from sandfleet.worker.sandbox.channel import (
    AgentChannel,
    ChannelClosedError,
    ChannelError,
    ChannelTimeoutError,
)
from sandfleet.worker.sandbox.isolation import network_refusal
from sandfleet.worker.sandbox.spec import Owner, agent_payload, command_env, container_kwargs

log = logging.getLogger("sandfleet.sandbox")

HELLO_TIMEOUT_S = 60.0
FILE_TIMEOUT_S = 60.0
KILL_GRACE_S = 1.0
DEFAULT_OUTPUT_CAP = 1024**2
MAX_FILE_BYTES = 256 * 1024**2
TOOL_SUBSTEP_S = 5.0
PING_FRESH_S = 1.0  # a successful ping vouches for the engine this long (jobs preflight twice each)

# (header, body) of one tool call from the program -> the JSON reply bytes to send back.
CallHandler = Callable[[dict[str, Any], bytes], bytes]


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
    oom_killed: bool = False
    duration_s: float = 0.0
    agent_run_s: float = 0.0
    forked: bool = False  # a Python program run in a fork of the agent (no new interpreter)
    survivors: int = 0
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
    """A started container whose agent is waiting for work."""

    def __init__(
        self,
        client: Any,
        config: SandboxConfig,
        container_id: str,
        channel: AgentChannel,
        hello: dict[str, Any],
        start_s: float,
    ) -> None:
        self._client = client
        self.config = config
        self.channel = channel
        self.hello = hello
        self.start_s = start_s
        self.id = container_id
        self.runtime = config.docker_runtime
        self.destroyed = False
        self.used = False

    # -- life cycle ---------------------------------------------------------------------------

    @classmethod
    def start(
        cls,
        config: SandboxConfig,
        *,
        owner: Owner | None = None,
        labels: dict[str, str] | None = None,
        client: Any | None = None,
    ) -> SandboxContainer:
        """Create, attach and start a container, send it the agent and wait for its hello.

        Raises:
            SandboxUnavailableError: no engine.
            SandboxError: the container cannot be made as configured (runtime, image, filter).
        """
        began = time.monotonic()
        client = client or engine.docker_client()
        info = preflight(config, client)
        kwargs = container_kwargs(
            config, owner=owner or Owner.current(), host_ncpu=info["ncpu"], labels=labels
        )
        try:
            container_id = engine.create_container(client, kwargs)
        except engine.ImageNotFoundError as e:
            raise SandboxError(
                f"sandbox image {config.image!r} is not on this engine; build it with `sandfleet images build`"
            ) from e
        except engine.DockerError as e:
            raise _translate(e, "create the sandbox") from e
        channel = None
        try:
            sock = client.api.attach_socket(
                container_id, params={"stdin": 1, "stdout": 1, "stderr": 1, "stream": 1}
            )
            channel = AgentChannel(engine.raw_socket(sock))
            client.api.start(container_id)
            if config.network == "restricted":
                from sandfleet.worker.sandbox.network import install_restricted_filter

                install_restricted_filter(client, container_id)
            channel.send_raw(agent_payload())
            kind, hello, _ = channel.recv(time.monotonic() + HELLO_TIMEOUT_S, max_body=0)
            if kind != b"H":
                raise SandboxError(f"the sandbox agent did not say hello (got {kind!r})")
            if not hello.get("syscall_filter"):
                raise SandboxError("the sandbox's syscall filter could not be installed; refusing to use it")
            if refusal := network_refusal(config, hello.get("network")):
                raise SandboxError(refusal)
        except BaseException as e:
            if channel:
                channel.close()
            killed = isinstance(e, ChannelError) and _killed_from_outside(client, container_id)
            _remove(client, container_id)
            if isinstance(e, ChannelError):
                if killed or not _engine_answers(client):  # the engine stopped and took the sandbox with it
                    raise engine.unavailable(f"the engine went away while the sandbox started ({e})") from e
                raise SandboxError(f"the sandbox did not start: {e}") from e
            if isinstance(e, engine.DockerError):
                raise _translate(e, "start the sandbox") from e
            raise
        return cls(client, config, container_id, channel, hello, time.monotonic() - began)

    def destroy(self) -> None:
        """Kill and remove the container. Never raises."""
        if self.destroyed:
            return
        self.destroyed = True
        self.channel.close()
        _remove(self._client, self.id)

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
    ) -> ExecResult:
        """Run one command to completion (or its deadline) and return what it did.

        With ``python_script`` (``argv`` being ``python3 -s`` of it) the agent may run the script
        in a fork of its own interpreter instead, when the environment would start Python the
        same way; the result says ``forked``. It behaves as ``argv`` would, for less CPU.

        With ``on_call`` the command gets the tool bridge: each call is handed to ``on_call`` and
        its reply sent back. The deadline is enforced by the agent and, one second later, by the
        host, which then kills the container outright.
        """
        self.used = True
        began = time.monotonic()
        deadline = began + timeout if timeout else None
        self.channel.send(
            b"E",
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
            },
            stdin,
        )
        max_body = 2 * max_output + max_result + max_request + 1024
        kill_sent = False
        hard_deadline = None if deadline is None else deadline + 3 * KILL_GRACE_S
        while True:
            if hard_deadline is not None and time.monotonic() >= hard_deadline:
                # Frames keep coming (a program flooding the bridge) but never "done": the host's
                # deadline holds even when the channel never goes quiet long enough to time out.
                self.destroy()
                return self._lost(
                    began, timeout, "the sandbox did not stop at its deadline and was destroyed"
                )
            wait_until = None if deadline is None else deadline + (2 if kill_sent else 1) * KILL_GRACE_S
            try:
                kind, header, body = self.channel.recv(wait_until, max_body)
            except ChannelTimeoutError:
                if not kill_sent:
                    kill_sent = True
                    self._send_quietly(b"K")
                    continue
                self.destroy()
                return self._lost(
                    began, timeout, "the sandbox did not stop at its deadline and was destroyed"
                )
            except ChannelError as e:
                try:
                    oom = self._died_of_oom()  # raises SandboxUnavailableError when the engine went away
                finally:
                    self.destroy()
                if oom:
                    return ExecResult(
                        stdout="",
                        stderr="the sandbox ran out of memory and was killed",
                        exit_code=137,
                        oom_killed=True,
                        limits_hit=[Limit.MEMORY],
                        duration_s=time.monotonic() - began,
                    )
                return self._lost(
                    began, timeout if deadline and time.monotonic() >= deadline else None, str(e)
                )
            if kind == b"D":
                return self._finished(header, body, began, timeout)
            if kind == b"C" and on_call is not None:
                reply = on_call(header, body)
                self._send_quietly(b"T", {}, reply)
            elif kind == b"A":
                continue  # a late answer to a command frame sent while busy
            else:
                self.destroy()
                return self._lost(began, None, f"the sandbox broke the protocol (frame {kind!r})")

    def _died_of_oom(self) -> bool:
        """Whether the container itself was OOM-killed (under gVisor the whole sandbox goes at once).

        Raises:
            SandboxUnavailableError: the engine does not answer: it stopped, and took the container
                with it. That is infrastructure, not the program's failure: the job is retried.
        """
        for _ in range(20):  # the engine records the exit a moment after the stream closes
            try:
                state = self._client.api.inspect_container(self.id)["State"]
            except engine.TransportError as e:
                raise engine.unavailable(e) from e
            except engine.DockerError:
                return False
            if not state.get("Running"):
                return bool(state.get("OOMKilled")) or state.get("ExitCode") == 137
            time.sleep(0.05)
        return False

    def _send_quietly(self, kind: bytes, header: dict[str, Any] | None = None, body: bytes = b"") -> None:
        try:
            self.channel.send(kind, header, body)
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
        self._ask(b"W", {"path": self._abs(path), "mode": mode}, payload)

    def put_files(self, files: dict[str, bytes]) -> None:
        """Write several files in one round trip (frames pipelined, answers read afterwards)."""
        for path, data in files.items():
            self.channel.send(b"W", {"path": self._abs(path), "mode": 0o644}, data)
        for path in files:
            try:
                kind, answer, _ = self.channel.recv(time.monotonic() + FILE_TIMEOUT_S, 1024)
            except ChannelError as e:
                raise SandboxError(f"the sandbox did not answer: {e}") from e
            if kind != b"A" or not answer.get("ok"):
                raise SandboxError(f"{path}: {answer.get('error', 'cannot write')}")

    def read_file(self, path: str, max_bytes: int = 64 * 1024**2) -> bytes:
        _, body = self._ask(b"R", {"path": self._abs(path), "max_bytes": max_bytes}, max_body=max_bytes)
        return body

    def list_files(self, path: str | None = None) -> list[str]:
        header, _ = self._ask(b"L", {"path": self._abs(path or self.config.workdir)})
        return list(header.get("files", []))

    def _abs(self, path: str) -> str:
        return path if path.startswith("/") else f"{self.config.workdir.rstrip('/')}/{path}"

    def _ask(
        self, kind: bytes, header: dict[str, Any], body: bytes = b"", max_body: int = 1024
    ) -> tuple[dict[str, Any], bytes]:
        self.channel.send(kind, header, body)
        try:
            answer_kind, answer, data = self.channel.recv(time.monotonic() + FILE_TIMEOUT_S, max_body)
        except ChannelError as e:
            raise SandboxError(f"the sandbox did not answer: {e}") from e
        if answer_kind != b"A":
            raise SandboxError(f"unexpected answer from the sandbox: {answer_kind!r}")
        if not answer.get("ok"):
            raise SandboxError(f"{header.get('path', '')}: {answer.get('error', 'failed')}")
        return answer, data

    def inspect(self) -> dict[str, Any]:
        """Docker's own view of the container (``docker inspect``)."""
        try:
            return self._client.api.inspect_container(self.id)
        except engine.DockerError as e:
            raise _translate(e, "inspect the sandbox") from e


def preflight(config: SandboxConfig, client: Any | None = None) -> dict[str, Any]:
    """Check, before anything starts, that the engine can make this sandbox; returns the engine facts.

    Raises:
        SandboxUnavailableError: no engine.
        SandboxError: the runtime is not registered, the image is missing, or the network mode
            cannot be enforced under the runtime.
    """
    client = client or engine.docker_client()
    info = _engine_facts(client)
    if time.monotonic() - info["pinged"] > PING_FRESH_S:  # the facts are cached: is the engine there now?
        try:
            client.ping()
        except engine.DockerError as e:
            raise engine.unavailable(e) from e
        info["pinged"] = time.monotonic()
    if config.docker_runtime not in info["runtimes"]:
        raise SandboxError(
            f"Docker runtime {config.docker_runtime!r} is not registered with the engine; registered "
            f"runtimes: {', '.join(sorted(info['runtimes']))}. Run deploy/bootstrap.sh to register gVisor."
        )
    if config.network == "restricted" and config.docker_runtime.startswith("runsc"):
        raise SandboxError(
            "network 'restricted' is not supported under gVisor: its filter cannot be installed from "
            "the host; use network 'none' or the runc runtime"
        )
    if config.image not in info["images"]:
        try:
            client.images.get(config.image)
        except engine.ImageNotFoundError as e:
            raise SandboxError(
                f"sandbox image {config.image!r} is not on this engine; build it with `sandfleet images build`"
            ) from e
        except engine.DockerError as e:
            raise _translate(e, "look up the sandbox image") from e
        info["images"].add(config.image)
    return info


def _timeout_note(stderr: str, timeout: float | None) -> str:
    note = f"Command timed out after {timeout:g} seconds; its processes were killed"
    return f"{stderr.rstrip()}\n{note}" if stderr.strip() else note


_facts: dict[int, dict[str, Any]] = {}


def _engine_facts(client: Any) -> dict[str, Any]:
    """Runtimes and CPU count of an engine, asked once per client."""
    facts = _facts.get(id(client))
    if facts is None:
        try:
            info = client.info()
        except engine.DockerError as e:
            raise _translate(e, "reach the engine") from e
        facts = {
            "runtimes": set(info.get("Runtimes", {})),
            "ncpu": int(info.get("NCPU", 1)),
            "images": set(),
            "pinged": 0.0,
        }
        _facts[id(client)] = facts
    return facts


def _translate(e: Exception, doing: str) -> Exception:
    text = str(e)
    if isinstance(e, engine.TransportError):
        return engine.unavailable(e)
    if "Connection" in text or ("connect" in text.lower() and "refused" in text.lower()):
        return engine.unavailable(text)
    explanation = getattr(e, "explanation", None) or text
    server_error = getattr(e, "is_server_error", None)
    if doing in ("create the sandbox", "start the sandbox") and server_error and server_error():
        # preflight vouched for the runtime and the image: an engine-side failure now (a daemon
        # stopping mid-create: "error creating overlay mount ...") is worth retrying later
        return engine.unavailable(f"cannot {doing}: {explanation}")
    return SandboxError(f"cannot {doing}: {explanation}")


def _killed_from_outside(client: Any, container_id: str) -> bool:
    """Whether a sandbox that died before its agent spoke was killed by its engine (stopping:
    SIGTERM/SIGKILL, or already gone) rather than failing by itself (no python3, out of memory)."""
    for _ in range(20):  # the engine records the exit a moment after the stream closes
        try:
            state = client.api.inspect_container(container_id)["State"]
        except engine.NotFoundError:
            return True
        except engine.DockerError:
            return True  # the engine itself is going
        if not state.get("Running"):
            return not state.get("OOMKilled") and state.get("ExitCode") in (137, 143)
        time.sleep(0.05)
    return False


def _engine_answers(client: Any) -> bool:
    try:
        client.ping()
    except engine.DockerError:
        return False
    return True


def _remove(client: Any, container_id: str) -> None:
    try:
        client.api.remove_container(container_id, force=True)
    except engine.NotFoundError:
        pass
    except Exception as e:  # removal must never raise; the reaper finds what is left
        log.warning("could not remove sandbox container %s: %s", container_id[:12], e)


def dumps(value: Any) -> bytes:
    return json.dumps(value, separators=(",", ":")).encode()
