"""One restricted sandbox's network namespace, held open by the worker from the sandbox's start to its removal.

The worker opens ``/proc/<pid>/ns/net`` once, right after the container started, and keeps the
descriptor. Every later step reaches the namespace through it, never through the pid again: a
sandbox whose processes died, or a pid reused by another process meanwhile, cannot send a step to
another namespace (the host's), and the namespace lives on, its filter and counters with it, until
the worker has read them and closed the descriptor. Two ways in: ``run`` (a command under ``nsenter
--net=/proc/self/fd/N``) and ``call`` (a function in a short-lived thread that has setns(2)-ed in
and out: a socket or file it opens belongs to the namespace). Standard library only.
"""

from __future__ import annotations

import ctypes
import os
import subprocess
import threading
from collections.abc import Callable
from typing import TypeVar

_CLONE_NEWNET = 0x40000000
CALL_TIMEOUT_S = 10.0
RUN_TIMEOUT_S = 20.0

T = TypeVar("T")


class NetnsError(OSError):
    """The sandbox's namespace cannot be opened or entered, or it was closed already."""


def _setns(fd: int) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.setns(fd, _CLONE_NEWNET) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"setns: {os.strerror(err)}")


class SandboxNetns:
    """The open descriptor of one sandbox's network namespace (``close`` releases it)."""

    def __init__(self, fd: int) -> None:
        self._fd = fd
        self._lock = threading.Lock()

    @classmethod
    def open(cls, pid: int) -> SandboxNetns:
        """The namespace of process ``pid`` (the container's first process, just started).

        Raises:
            NetnsError: the process is gone, its namespace cannot be opened, or it is the worker's
                own (a pid reused by a host process: never filter the host's namespace).
        """
        try:
            fd = os.open(f"/proc/{pid}/ns/net", os.O_RDONLY | os.O_CLOEXEC)
        except OSError as e:
            raise NetnsError(
                f"cannot open the sandbox's network namespace (pid {pid}): {e.strerror}"
            ) from None
        if os.fstat(fd).st_ino == os.stat("/proc/self/ns/net").st_ino:  # the pid went and came back
            os.close(fd)
            raise NetnsError(f"process {pid} is in the worker's own network namespace, not a sandbox's")
        return cls(fd)

    @property
    def closed(self) -> bool:
        return self._fd < 0

    def _held(self) -> int:
        if self._fd < 0:  # never a number the process may have given to another file since
            raise NetnsError("the sandbox's network namespace was released")
        return self._fd

    def run(self, args: list[str], stdin: str | None = None) -> subprocess.CompletedProcess[str]:
        """``args`` run inside the namespace (the host's binaries and files: only the network differs).

        Raises:
            NetnsError: the namespace was released.
        """
        with self._lock:
            fd = self._held()
            return subprocess.run(
                ["nsenter", f"--net=/proc/self/fd/{fd}", *args],
                input=stdin,
                capture_output=True,
                text=True,
                timeout=RUN_TIMEOUT_S,
                pass_fds=(fd,),
            )

    def call(self, fn: Callable[[], T], name: str = "sandfleet-netns") -> T:
        """``fn()`` in a thread that has entered the namespace (and left it again before it ends).

        Raises:
            NetnsError: the namespace was released, cannot be entered, or ``fn`` did not return
                within CALL_TIMEOUT_S; what ``fn`` raised, as the cause.
        """
        with self._lock:  # the thread's own copy: a close meanwhile cannot hand it another file
            fd = os.dup(self._held())
        outcome: dict[str, object] = {}

        def inside() -> None:
            try:
                own = os.open("/proc/thread-self/ns/net", os.O_RDONLY | os.O_CLOEXEC)
                try:
                    _setns(fd)
                    try:
                        if os.stat("/proc/thread-self/ns/net").st_ino != os.fstat(fd).st_ino:
                            raise OSError("the thread did not enter the sandbox's network namespace")
                        outcome["value"] = fn()
                    finally:
                        _setns(own)  # if this failed, the thread ends here anyway
                finally:
                    os.close(own)
            except Exception as e:  # reported by the caller, never lost with the thread
                outcome["error"] = e
            finally:
                os.close(fd)

        thread = threading.Thread(target=inside, name=name, daemon=True)
        thread.start()
        thread.join(CALL_TIMEOUT_S)
        if "value" not in outcome:
            error = outcome.get("error")
            raise NetnsError(f"{error or f'it did not answer within {CALL_TIMEOUT_S:g} s'}") from (
                error if isinstance(error, BaseException) else None
            )
        return outcome["value"]  # type: ignore[return-value]

    def close(self) -> None:
        """Release the namespace (it goes when the container has gone too). Idempotent."""
        with self._lock:
            if self._fd >= 0:
                os.close(self._fd)
                self._fd = -1
