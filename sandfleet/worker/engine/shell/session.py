"""One session sandbox: the container a shell job works in, from its first tool call to its end.

It is made with the same hardening and limits as any sandbox (sandfleet/worker/sandbox/docker/spec.py), labelled as a
session with the time its lifetime ends (the reaper removes it past that time, whoever owns it), and
used by one job only. Commands and file operations run one at a time (the agent is single-threaded).

The job's files come back as code-action's do: :meth:`SessionSandbox.make_folders` makes
/workspace/out/ before the first tool call, :meth:`SessionSandbox.collect` takes what is under it
(sandfleet/worker/program/artifacts.py, the same caps, checks and hashing) before the session is destroyed.

A session ends, for good, when the job ends, when it has been idle for its idle cap, at its lifetime
cap, or when the container dies (killed, out of memory, engine gone). After that every operation
raises :class:`SessionGoneError` saying why: the model is told, the job never hangs on it.
"""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path
from typing import Any

from sandfleet.core import json_limits
from sandfleet.core.contracts import Limit, SessionRecord
from sandfleet.worker.egress.refusals import take_refusals
from sandfleet.worker.program.artifacts import ArtifactCaps, Collection, collect_artifacts
from sandfleet.worker.sandbox.channel import ChannelError
from sandfleet.worker.sandbox.container import ExecResult, SandboxContainer
from sandfleet.worker.sandbox.docker.spec import command_env

log = logging.getLogger("sandfleet.shell")

FILES_HELPER = Path(__file__).resolve().parents[2] / "sandbox" / "inside" / "files_helper.py"
HELPER_PATH = "/tmp/.sandfleet/files.py"  # written afresh before every file operation
HELPER_TIMEOUT_S = 30.0
HELPER_ANSWER_BYTES = 1024 * 1024  # of the helper's JSON line, besides what it quotes of a file
ENDED_BY_JOB = "the job ended"


class SessionGoneError(Exception):
    """The session sandbox is gone; ``str()`` says why and what it means, in words for the model."""

    @classmethod
    def because(cls, reason: str) -> SessionGoneError:
        return cls(
            f"{reason}. Its files are lost and no sandbox tool works for the rest of this job: "
            "answer with what you have"
        )


class SessionSandbox:
    """A started container for one shell job. Thread-safe: one operation at a time.

    Args:
        container: the started container (its agent said hello).
        job_id: the job it belongs to.
        lifetime_s: seconds it may live in all (its sandbox timeout, bounded by the job's wall time).
        idle_s: seconds it may sit unused before it is destroyed.
    """

    def __init__(self, container: SandboxContainer, *, job_id: str, lifetime_s: float, idle_s: float) -> None:
        self.container = container
        self.job_id = job_id
        self.started_at = time.monotonic()
        self.expires_at = self.started_at + lifetime_s
        self.idle_s = idle_s
        self.last_used = self.started_at
        self.ended: str | None = None
        self.ended_at: float | None = None
        self.limits_hit: list[Limit] = []
        self.network_denied: list[dict[str, Any]] = []  # refused by the egress proxy or filter, every command
        self.refused_total = 0  # every refusal: network_denied's counts and the filter's past its log rate
        self.refused_unlisted = 0  # of which network_denied does not itemise
        self._lock = threading.Lock()

    # -- state ----------------------------------------------------------------------------------

    @property
    def alive(self) -> bool:
        return self.ended is None

    def seconds_left(self, now: float | None = None) -> float:
        """Seconds until the lifetime cap."""
        return self.expires_at - (time.monotonic() if now is None else now)

    def record(self) -> SessionRecord:
        ended_at = self.ended_at if self.ended_at is not None else time.monotonic()
        return SessionRecord(
            container_id=self.container.id,
            runtime=self.container.runtime,
            started_s=self.container.start_s,
            lifetime_s=ended_at - self.started_at,
            ended=self.ended or "",
            limits_hit=list(self.limits_hit),
            network_denied=list(self.network_denied),
            refused_total=self.refused_total,
            refused_unlisted=self.refused_unlisted,
        )

    # -- operations -----------------------------------------------------------------------------

    def execute(
        self,
        argv: list[str],
        *,
        timeout_s: float,
        max_output: int,
        tail: int,
        mkdirs: list[str] | None = None,
    ) -> ExecResult:
        """Run one command in the workspace with the given caps (``mkdirs``: folders made before it).

        Raises:
            SessionGoneError: the session had ended, or the container died during the command.
        """
        with self._busy():
            try:
                done = self.container.execute(
                    argv,
                    timeout=timeout_s,
                    max_output=max_output,
                    tail=tail,
                    cwd=self.container.config.workdir,
                    mkdirs=mkdirs,
                )
            except ChannelError as e:
                self._end(f"the session sandbox stopped answering ({e})")
                raise SessionGoneError.because(self.ended or "") from e
            self._note_denials()
            if self.container.destroyed:  # the container died, or overran its deadline and was destroyed
                self._end(_death(done))
                raise SessionGoneError.because(self.ended or "")
            return done

    def _note_denials(self) -> None:
        refusals = take_refusals(self.container)
        self.network_denied += refusals.denials
        self.refused_total += refusals.total
        self.refused_unlisted += refusals.unlisted
        if refusals.total and Limit.NETWORK not in self.limits_hit:
            self.limits_hit.append(Limit.NETWORK)

    def file_operation(self, op: str, path: str, *, limit: int = 0, stdin: bytes = b"") -> dict[str, Any]:
        """Run the in-container file helper (files_helper.py) for one operation; its JSON answer.

        Raises:
            SessionGoneError: the session had ended or died meanwhile.
            OSError: the helper gave no readable answer (the message says what it printed).
        """
        config = self.container.config
        if "\0" in path:
            raise ValueError("a path cannot hold NUL characters")
        env = {
            **command_env(config),
            "SANDFLEET_FILES_OP": op,
            "SANDFLEET_FILES_ROOT": config.workdir,
            "SANDFLEET_FILES_PATH": path,
            "SANDFLEET_FILES_LIMIT": str(limit),
        }
        with self._busy():
            try:
                self.container.write_file(HELPER_PATH, FILES_HELPER.read_bytes())
                done = self.container.execute(
                    ["python3", "-s", HELPER_PATH],
                    timeout=HELPER_TIMEOUT_S,
                    stdin=stdin,
                    env=env,
                    cwd=config.workdir,
                    max_output=HELPER_ANSWER_BYTES + 6 * limit,  # JSON escapes grow text up to 6x
                    python_script=HELPER_PATH,
                )
            except ChannelError as e:
                self._end(f"the session sandbox stopped answering ({e})")
                raise SessionGoneError.because(self.ended or "") from e
            except Exception as e:  # SandboxError from write_file: the agent did not answer
                if not self.container.channel.is_open():
                    self._end(f"the session sandbox died ({e})")
                    raise SessionGoneError.because(self.ended or "") from e
                raise OSError(f"the file helper could not be started: {e}") from e
            if self.container.destroyed:
                self._end(_death(done))
                raise SessionGoneError.because(self.ended or "")
        return _parse_answer(done)

    def make_folders(self, folders: list[str]) -> None:
        """Make ``folders`` (as the sandbox's user) before the model's first tool call: the artifacts
        folder is there as it is for a code-action program. A session gone meanwhile is left to the
        tools to report."""
        try:
            self.execute(["true"], timeout_s=HELPER_TIMEOUT_S, max_output=1024, tail=0, mkdirs=folders)
        except SessionGoneError as e:
            log.info("session sandbox %s: folders not made: %s", self.container.id[:12], e)

    def read_file(self, path: str, *, max_bytes: int) -> bytes:
        """A file's bytes (at most ``max_bytes``: more raises SandboxError), e.g. the saved workspace.

        Raises:
            SessionGoneError: the session had ended.
            SandboxError: the file is missing or larger than ``max_bytes``.
        """
        with self._busy():
            return self.container.read_file(path, max_bytes=max_bytes)

    def restore_files(self, folders: list[str], files: dict[str, tuple[bytes, int]]) -> None:
        """Make ``folders`` and write ``files`` (absolute path -> bytes, mode) through the agent, as the
        sandbox's user: a suspended job's workspace put back (shell/workspace.py checked every name).

        Raises:
            SessionGoneError: the session had ended or died.
            SandboxError: the agent refused a write.
        """
        if folders:
            self.execute(["true"], timeout_s=HELPER_TIMEOUT_S, max_output=1024, tail=0, mkdirs=folders)
        with self._busy():
            plain = {path: body for path, (body, mode) in files.items() if mode == 0o644}
            if plain:
                self.container.put_files(plain)
            for path, (body, mode) in files.items():
                if mode != 0o644:
                    self.container.write_file(path, body, mode)

    def collect(self, caps: ArtifactCaps) -> Collection:
        """The files the job left under /workspace/out/, by code-action's collection (same caps,
        checks and hashing), taken before the session is destroyed. A session already gone (a cap,
        its container died) took its files with it: nothing, as from a destroyed code-action sandbox."""
        try:
            with self._busy():
                return collect_artifacts(self.container, caps)
        except SessionGoneError:
            return Collection()

    # -- ending ---------------------------------------------------------------------------------

    def expire(self, now: float) -> bool:
        """Destroy the session if its idle or lifetime cap has passed (the keeper's watchdog calls
        this); True when it did. A session busy with an operation is left alone: that operation's
        own timeout is bounded by the lifetime left."""
        if not self._lock.acquire(blocking=False):
            return False
        try:
            if self.ended is not None:
                return False
            if now >= self.expires_at:
                lifetime = self.expires_at - self.started_at
                reason, limit = (
                    f"it reached its lifetime cap of {lifetime:g} s and was destroyed",
                    Limit.LIFETIME,
                )
            elif now - self.last_used >= self.idle_s:
                reason, limit = (
                    f"it was idle for {self.idle_s:g} s (its idle cap) and was destroyed",
                    Limit.IDLE,
                )
            else:
                return False
            self.limits_hit.append(limit)
            self._end(f"the session sandbox is gone: {reason}")
            return True
        finally:
            self._lock.release()

    def close(self, reason: str = ENDED_BY_JOB) -> None:
        """End the session (if it still runs) and destroy the container. Never raises."""
        with self._lock:
            self._end(reason)

    def _end(self, reason: str) -> None:  # holds _lock (or the session is not shared yet)
        if self.ended is None:
            self.ended = reason
            self.ended_at = time.monotonic()
            log.info("session sandbox %s of job %s: %s", self.container.id[:12], self.job_id, reason)
        self.container.destroy()
        self._note_denials()  # what the sandbox refused since the last command (kept by its removal)

    def _busy(self) -> _Busy:
        return _Busy(self)


class _Busy:
    """Holds the session's lock for one operation and refuses one on an ended session."""

    def __init__(self, session: SessionSandbox) -> None:
        self.session = session

    def __enter__(self) -> None:
        self.session._lock.acquire()
        if self.session.ended is not None:
            self.session._lock.release()
            raise SessionGoneError.because(self.session.ended)
        self.session.last_used = time.monotonic()

    def __exit__(self, *exc: object) -> None:
        self.session.last_used = time.monotonic()
        self.session._lock.release()


def _death(done: ExecResult) -> str:
    """Why the container died during a command, from what execute returned."""
    if done.killed_from_outside:
        return (
            "the session sandbox was killed from outside (docker kill, its removal, or the engine stopping)"
        )
    if done.oom_killed:
        return "the session sandbox was killed: it ran out of memory"
    if done.agent_killed:
        return "the session sandbox was killed: a command killed its agent process"
    if done.timed_out:
        return "the session sandbox did not stop at the command's deadline and was destroyed"
    return f"the session sandbox died: {done.protocol_error or done.stderr or 'its agent went away'}"


def _parse_answer(done: ExecResult) -> dict[str, Any]:
    """The helper's one line of JSON; OSError quoting what it printed when there is none."""
    line = done.stdout.partition("\n")[0]
    try:
        header = json_limits.loads(line, "the helper's answer")
    except ValueError:  # JsonLimitError too
        header = None
    if not isinstance(header, dict):
        detail = (done.stderr or done.stdout or f"exit code {done.exit_code}").strip()[-500:]
        raise OSError(f"the in-sandbox file helper gave no answer: {detail}")
    return header
