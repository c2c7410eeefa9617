"""Which file a ``replay:FILE`` model name may reach, by who named it, and reading a job's one safely.

A model name is the operator's or a job's (``ModelTrust``):

- ``OPERATOR``: the user of this process named it (``sandfleet ask``, ``compare``, ``demo``'s own
  script, ``model-server --script``, a worker's own ``SANDFLEET_MODEL``). FILE is any file that user
  can read, and a bad script's error says what is wrong in it.
- ``SUBMITTER``: a job's ``model`` field, written by whoever can submit. FILE must be a regular file
  inside ``SANDFLEET_REPLAY_SCRIPTS_DIR`` (unset: every such name is refused), named relative to that
  folder or by an absolute path inside it.

Confinement: the folder is opened, then the path below it is walked one component at a time with
``openat(..., O_NOFOLLOW)``, and the file read is the descriptor so opened. A symbolic link anywhere
below the folder, a ``..``, an absolute path elsewhere, a folder, a FIFO or a device is refused; nothing
outside the folder is ever opened, so neither a message nor a timing tells whether such a path exists,
and nothing can be swapped in between the check and the read (there is no separate check). Links are
refused even when they point inside: telling those apart would mean resolving them, which is the step
that can leave the folder.

What a job is told: one message for every name that does not reach a regular file in the folder
(missing, outside, a link), another for a file that is there but is not a valid script. Neither quotes
the file nor the parser; the parser's message goes to the worker's log, which is the operator's.
"""

from __future__ import annotations

import enum
import logging
import os
import stat
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from sandfleet.core.errors import InvalidSpecError
from sandfleet.worker.llm.scripted.script import ReplayScript, parse_script_text

logger = logging.getLogger("sandfleet.llm.replay")

SCRIPTS_DIR_SETTING = "SANDFLEET_REPLAY_SCRIPTS_DIR"
# A script is a few kilobytes; the demo's is 3 KB. The cap keeps a job from making the worker read a
# large file into memory (a log, say, that the operator keeps in the folder).
MAX_SCRIPT_BYTES = 4 * 1024 * 1024

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
# O_NONBLOCK: opening a FIFO for reading would otherwise wait for a writer; it is refused right after.
_FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


class ModelTrust(enum.Enum):
    """Who named a model, and so which files its ``replay:FILE`` may name."""

    OPERATOR = "operator"  # this process's own user: any file
    SUBMITTER = "submitter"  # a job: only a regular file inside SANDFLEET_REPLAY_SCRIPTS_DIR


@dataclass(frozen=True)
class ConfinedScript:
    """A job's replay script, read through a descriptor opened inside the folder.

    Attributes:
        path: where it is (the folder's real path and the components walked: no links in it), the
            key its replay server is shared under.
        text: its content, still unparsed.
        model: the model name, for messages.
    """

    path: Path
    text: str
    model: str

    def parse(self) -> ReplayScript:
        """The validated script.

        Raises:
            InvalidSpecError: "not a valid replay script", without the parser's message (logged).
        """
        try:
            return parse_script_text(self.text, self.path)
        except Exception as e:  # whatever the parser raises: a malformed script, too deep a nesting
            raise _not_a_script(self.model, self.path, e) from None


def read_confined_script(name: str, scripts_dir: str | None) -> ConfinedScript:
    """Read the script a job names as ``replay:NAME``, only from inside ``scripts_dir``.

    Args:
        name: the file part of the job's model name, as the job wrote it.
        scripts_dir: the operator's ``SANDFLEET_REPLAY_SCRIPTS_DIR`` (None: not set).

    Raises:
        InvalidSpecError: the setting is unset; or the same message for a name that is missing,
            outside the folder, through a link, or not a regular file (the reason is logged); or the
            file is larger than ``MAX_SCRIPT_BYTES`` or not UTF-8 (then "not a valid replay script").
    """
    model = f"replay:{name}"
    if not scripts_dir:
        raise InvalidSpecError(
            f"model {model!r}: this worker takes no replay: models from jobs, {SCRIPTS_DIR_SETTING} is "
            "not set (the operator sets it to the folder of the replay scripts jobs may name)"
        )
    folder = os.path.expanduser(scripts_dir)
    real_folder = os.path.realpath(folder)
    parts = _parts_below(name, (os.path.abspath(folder), real_folder))
    if parts is None:
        raise _not_in_folder(model, "not a name below the folder")
    try:
        folder_fd = os.open(real_folder, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError as e:
        raise _not_in_folder(model, f"the folder {real_folder} cannot be opened: {e.strerror or e}") from None
    try:
        fd = _open_below(folder_fd, parts)
    except OSError as e:  # ENOENT, ELOOP (a link), ENOTDIR, EACCES: all look the same to the job
        raise _not_in_folder(model, e.strerror or str(e)) from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise _not_in_folder(model, "not a regular file")
        data = _read_at_most(fd, MAX_SCRIPT_BYTES + 1)
    finally:
        os.close(fd)
    path = Path(real_folder, *parts)
    try:
        if len(data) > MAX_SCRIPT_BYTES:
            raise ValueError(f"larger than {MAX_SCRIPT_BYTES} bytes")
        text = data.decode("utf-8")
    except ValueError as e:  # UnicodeDecodeError is one
        raise _not_a_script(model, path, e) from None
    return ConfinedScript(path, text, model)


def _parts_below(name: str, folders: tuple[str, ...]) -> tuple[str, ...] | None:
    """The components of ``name`` below the folder (given as its absolute and its real path), or
    None when it is empty, absolute elsewhere, climbs with ``..`` or holds a NUL byte."""
    if "\x00" in name:
        return None
    path = PurePosixPath(name)
    if path.is_absolute():
        for folder in folders:
            if path.is_relative_to(folder):
                path = path.relative_to(folder)
                break
        else:
            return None
    parts = path.parts
    if not parts or ".." in parts:
        return None
    return parts


def _open_below(folder_fd: int, parts: tuple[str, ...]) -> int:
    """A descriptor of ``parts`` below the open folder, opened without following any link; the
    folder's descriptor is closed."""
    fd = folder_fd
    try:
        for part in parts[:-1]:
            inner = os.open(part, _DIR_FLAGS, dir_fd=fd)
            os.close(fd)
            fd = inner
        return os.open(parts[-1], _FILE_FLAGS, dir_fd=fd)
    finally:
        os.close(fd)


def _read_at_most(fd: int, limit: int) -> bytes:
    chunks: list[bytes] = []
    size = 0
    while size < limit and (chunk := os.read(fd, min(65536, limit - size))):
        chunks.append(chunk)
        size += len(chunk)
    return b"".join(chunks)


def _not_in_folder(model: str, reason: str) -> InvalidSpecError:
    logger.warning("refused a job's replay model %r: %s", model, reason)
    return InvalidSpecError(
        f"model {model!r}: no replay script of that name in this worker's {SCRIPTS_DIR_SETTING} (a job's "
        "replay:FILE names a regular file inside that folder, relative to it; links and '..' are refused)"
    )


def _not_a_script(model: str, path: Path, problem: Exception) -> InvalidSpecError:
    logger.warning("replay script %s, named by a job as %r, is not valid: %s", path, model, problem)
    return InvalidSpecError(
        f"model {model!r}: the file is not a valid replay script (the worker's log says why)"
    )
