"""The five tools of shell mode, on one session sandbox: ordinary tools of a registry.

    sandbox_exec(command, timeout)     bash in /workspace; timeout capped by the job and the operator;
                                       the whole process tree killed at the deadline; output cut to
                                       head and tail with the real sizes reported
    sandbox_read_file(path)            a text file of the workspace (head and tail past the result cap)
    sandbox_write_file(path, content)  missing folders made; written atomically
    sandbox_list_files(path)           a folder's entries: name, kind, size
    sandbox_install_package(name)      pip from the operator's read-only wheelhouse, or from the
                                       network when the sandbox has one (restricted: the index of
                                       SANDFLEET_EGRESS_PIP_INDEX_URL through the egress proxy, pip
                                       itself from the wheelhouse, the proxy's refusals named in the
                                       error); otherwise a clear refusal

File paths are resolved inside the container (files_helper.py), never here: this module checks only
types and sizes. Everything the tools do goes through the sandbox's agent (container.execute); a
session that is gone makes every tool raise ``SessionGoneError`` with the reason.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sandfleet.core.config import ToolLoopSettings
from sandfleet.core.settings import Settings
from sandfleet.worker.engine.clip import shown_stream
from sandfleet.worker.engine.shell.keeper import WHEELHOUSE_INSIDE
from sandfleet.worker.engine.shell.session import SessionGoneError, SessionSandbox
from sandfleet.worker.tools.registry import ToolRegistry

SHELL_TOOL_NAMES = (
    "sandbox_exec",
    "sandbox_read_file",
    "sandbox_write_file",
    "sandbox_list_files",
    "sandbox_install_package",
)
MAX_COMMAND_CHARS = 100_000
MAX_WRITE_BYTES = 16 * 1024**2
MAX_LISTED_ENTRIES = 1000
MIN_TIMEOUT_S = 0.5  # less time than this left in the job or the session: the command is refused
DEADLINE_MARGIN_S = 1.0  # a command must end this long before the job's or session's end
# A package name, optionally pinned: "requests", "python-dateutil==2.9.0".
_PACKAGE = re.compile(r"^[A-Za-z0-9](?:[A-Za-z0-9._-]{0,98}[A-Za-z0-9])?(?:==[A-Za-z0-9.!+*_-]{1,64})?$")
USER_SITE = "$(python3 -s -c 'import site; print(site.getusersitepackages())')"
_OS_ERRORS = {
    cls.__name__: cls
    for cls in (
        PermissionError,
        FileNotFoundError,
        FileExistsError,
        IsADirectoryError,
        NotADirectoryError,
        ValueError,
        OSError,
    )
}


@dataclass(frozen=True)
class PackageSources:
    """Where a session may install packages from: the sandbox's ``network`` option (``none`` allows
    no index; ``restricted``: the index of SANDFLEET_EGRESS_PIP_INDEX_URL through the egress proxy)
    and the operator's ``wheelhouse`` on this host, when one is mounted in the sandbox."""

    network: str = "none"
    wheelhouse: Path | None = None

    def install_command(self, name: str) -> str:
        """The bash command that installs ``name``, or PermissionError saying why none can."""
        target = f'--target "{USER_SITE}"'
        common = f"install {target} --no-cache-dir --disable-pip-version-check --no-warn-script-location -q"
        pip = "python3 -s -m pip"
        if self.wheelhouse is not None:
            pips = sorted(self.wheelhouse.glob("pip-*.whl"))
            pip = f"python3 -s {WHEELHOUSE_INSIDE}/{pips[-1].name}/pip" if pips else pip
        if self.network == "restricted":  # the index (PIP_INDEX_URL) through the proxy, and the wheelhouse
            links = f" --find-links {WHEELHOUSE_INSIDE}" if self.wheelhouse is not None else ""
            return f"{pip} {common}{links} '{name}'"
        if self.wheelhouse is not None:
            return f"{pip} {common} --no-index --find-links {WHEELHOUSE_INSIDE} '{name}'"
        if self.network != "none":
            return f"python3 -s -m pip {common} '{name}'"
        raise PermissionError(
            f"cannot install {name}: this sandbox has no network (network=none) and the operator "
            "mounted no wheelhouse (SANDFLEET_WHEELHOUSE_DIR); use the packages the image has "
            "(python3 -c \"help('modules')\") or ask the operator for a wheelhouse or an image with it"
        )

    def used(self) -> str:
        """Where an install came from, in the words of the tool's answer."""
        if self.network == "restricted":
            return "the package index through the egress proxy"
        return "the operator's wheelhouse" if self.wheelhouse else "the package index"


class ShellTools:
    """The five tools bound to one session sandbox, with the job's caps.

    Args:
        session: the job's session sandbox.
        caps: the job's tool-loop caps (exec timeout, output and result sizes).
        settings: the operator's policy (the longest exec).
        deadline: the job's wall-clock end (``time.monotonic()``); commands end before it.
        sources: where ``sandbox_install_package`` may install from.
    """

    def __init__(
        self,
        session: SessionSandbox,
        *,
        caps: ToolLoopSettings,
        settings: Settings,
        deadline: float,
        sources: PackageSources,
    ) -> None:
        self.session = session
        self.caps = caps
        self.settings = settings
        self.deadline = deadline
        self.sources = sources

    def registry(self) -> ToolRegistry:
        """The five tools as a registry (their schemas come from these signatures, like any tool's)."""
        return ToolRegistry.from_functions(
            [
                self.sandbox_exec,
                self.sandbox_read_file,
                self.sandbox_write_file,
                self.sandbox_list_files,
                self.sandbox_install_package,
            ],
            module="sandbox",
        )

    # -- the tools ------------------------------------------------------------------------------

    def sandbox_exec(self, command: str, timeout: float | None = None) -> dict[str, Any]:
        """Run a bash command in the sandbox (working folder /workspace); returns exit_code, stdout, stderr.

        Each call is a fresh bash; files in /workspace persist, processes it leaves running are
        stopped when it returns. ``timeout`` is in seconds (default and maximum: the job's cap); at
        the deadline every process the command started is killed. Long output keeps head and tail.
        """
        if not isinstance(command, str) or not command.strip():
            raise ValueError("command must be a non-empty string of bash")
        if len(command) > MAX_COMMAND_CHARS:
            raise ValueError(f"command has {len(command)} characters; at most {MAX_COMMAND_CHARS}")
        timeout_s, note = self._timeout(timeout)
        budget = self.caps.max_output_bytes
        done = self.session.execute(
            ["bash", "-c", command], timeout_s=timeout_s, max_output=budget, tail=budget // 2
        )
        stdout = shown_stream(done.stdout, done.stdout_end, done.stdout_bytes, budget)
        stderr = shown_stream(done.stderr, done.stderr_end, done.stderr_bytes, budget)
        answer: dict[str, Any] = {
            "exit_code": None if done.timed_out else done.exit_code,
            "timed_out": done.timed_out,
            "stdout": stdout.text,
            "stderr": stderr.text,
            "stdout_bytes": stdout.total_bytes,
            "stderr_bytes": stderr.total_bytes,
            "timeout_s": timeout_s,
        }
        notes = [note] if note else []
        if done.timed_out:
            notes.append(f"killed at its timeout of {timeout_s:g} s, with every process it started")
        if stdout.truncated or stderr.truncated:
            notes.append(f"output over {budget:,} bytes per stream: head and tail kept")
        if done.oom_killed:
            notes.append("a process ran out of the sandbox's memory and was killed (exit 137)")
        if notes:
            answer["note"] = "; ".join(notes)
        return answer

    def sandbox_read_file(self, path: str) -> str:
        """The text of a file in the sandbox's workspace (a path relative to /workspace, or absolute inside it)."""
        limit = self.caps.max_result_bytes
        answer = self._files("read", path, limit=limit)
        shown = shown_stream(answer["head"], answer["tail"], int(answer["size"]), limit)
        return shown.text

    def sandbox_write_file(self, path: str, content: str) -> dict[str, Any]:
        """Write text to a file in the sandbox's workspace; missing folders are made, the file replaced atomically."""
        if not isinstance(content, str):
            raise TypeError(f"content must be a str, not {type(content).__name__}")
        data = content.encode("utf-8", "surrogatepass")
        if len(data) > MAX_WRITE_BYTES:
            raise ValueError(
                f"content is {len(data):,} bytes; sandbox_write_file writes at most {MAX_WRITE_BYTES:,}"
            )
        answer = self._files("write", path, stdin=data)
        return {"path": answer["path"], "bytes": answer["size"]}

    def sandbox_list_files(self, path: str = ".") -> dict[str, Any]:
        """The entries of a folder in the sandbox's workspace: name, kind (file, dir, symlink, other), size in bytes."""
        answer = self._files("list", path, limit=MAX_LISTED_ENTRIES)
        return {"path": answer["path"], "entries": answer["entries"], "left_out": answer["left_out"]}

    def sandbox_install_package(self, name: str) -> str:
        """Install a Python package (name or name==version) for python3 in the sandbox, where the operator allows it."""
        if not isinstance(name, str) or not _PACKAGE.match(name):
            raise ValueError(
                f"give a package name, optionally pinned (like 'requests' or 'attrs==23.2.0'), not {name!r}"
            )
        command = self.sources.install_command(name)
        timeout_s, _ = self._timeout(None)
        denied_before = len(self.session.network_denied)
        done = self.session.execute(
            ["bash", "-c", command], timeout_s=timeout_s, max_output=self.caps.max_output_bytes, tail=4096
        )
        if done.timed_out:
            raise TimeoutError(f"installing {name} did not finish within {timeout_s:g} s")
        if done.exit_code != 0:
            why = (done.stderr_end or done.stderr or done.stdout_end).strip()[-2000:]
            if "No module named pip" in why:
                why = "this sandbox image has no pip, and the wheelhouse holds no pip wheel"
            refused = _refusals(self.session.network_denied[denied_before:])
            raise RuntimeError(f"pip could not install {name}: {refused}{why}")
        return (
            f"installed {name} from {self.sources.used()} into the user site-packages of /workspace: "
            "`python3` imports it (pure-Python packages only: the workspace is mounted noexec)"
        )

    # -- helpers --------------------------------------------------------------------------------

    def _timeout(self, asked: Any) -> tuple[float, str]:
        """The seconds a command may run (``None``: as long as the caps allow), and a note when the
        asked timeout was capped."""
        if asked is not None and (
            isinstance(asked, bool) or not isinstance(asked, int | float) or not asked > 0
        ):
            raise ValueError(f"timeout must be a number of seconds above 0, not {asked!r}")
        if not self.session.alive:  # a gone session says why, before any arithmetic on its lifetime
            raise SessionGoneError.because(self.session.ended or "the session sandbox is gone")
        now = time.monotonic()
        caps = {
            "the job's exec_timeout": self.caps.exec_timeout,
            "the operator's SANDFLEET_POLICY_MAX_EXEC_TIMEOUT_S": self.settings.policy_max_exec_timeout_s,
            "the time left in the job": self.deadline - now - DEADLINE_MARGIN_S,
            "the session sandbox's lifetime left": self.session.seconds_left(now) - DEADLINE_MARGIN_S,
        }
        which, cap = min(caps.items(), key=lambda item: item[1])
        if cap < MIN_TIMEOUT_S:
            raise TimeoutError(f"no time left for a command ({which} is {max(cap, 0):.1f} s)")
        if asked is None:
            return round(cap, 3), ""
        if asked <= cap:
            return float(asked), ""
        return round(cap, 3), f"timeout capped at {cap:g} s (asked {asked:g} s) by {which}"

    def _files(self, op: str, path: Any, *, limit: int = 0, stdin: bytes = b"") -> dict[str, Any]:
        if not isinstance(path, str):
            raise TypeError(f"path must be a str, not {type(path).__name__}")
        answer = self.session.file_operation(op, path, limit=limit, stdin=stdin)
        if not answer.get("ok"):
            error = _OS_ERRORS.get(str(answer.get("error_type")), RuntimeError)
            raise error(str(answer.get("error", "the file operation failed")))
        return answer


def _refusals(denials: list[dict[str, Any]]) -> str:
    """``the egress proxy refused HOST:PORT (reason); `` for the refusals of one command, or ""."""
    if not denials:
        return ""
    shown = ", ".join(f"{d.get('host')}:{d.get('port')} ({d.get('reason')})" for d in denials[:5])
    more = f" and {len(denials) - 5} more" if len(denials) > 5 else ""
    return f"the egress proxy refused {shown}{more}; pip said: "
