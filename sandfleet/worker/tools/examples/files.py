"""Reading text files from the data folder, and nothing outside it.

Tools run on the worker host with the worker's rights, and their arguments come from a model-written
program: whoever can steer the model chooses them. So every tool must validate its own arguments. Here
that means: relative paths only, no ``..``, and the resolved file (symlinks followed) must still lie
inside the data folder; anything else raises ``PermissionError``.
"""

from __future__ import annotations

import os
from pathlib import Path, PurePosixPath

from sandfleet.worker.tools.examples._data import data_dir

__all__ = ["list_files", "read_text"]

MAX_READ_BYTES = 10 * 1024 * 1024
MAX_LISTED_FILES = 10_000


def read_text(path: str) -> str:
    """The UTF-8 text of a file in the data folder, by relative path (like "notes/q3.txt").

    Validates its argument, as every tool must: absolute paths, ``..`` and symlinks that lead out of the
    data folder raise PermissionError; files over 10 MiB raise ValueError.
    """
    target = _inside_data_dir(path)
    if not target.exists():
        raise FileNotFoundError(f"no file {path!r} in the data folder; list_files() shows what there is")
    if not target.is_file():
        raise IsADirectoryError(f"{path!r} is not a regular file")
    size = target.stat().st_size
    if size > MAX_READ_BYTES:
        raise ValueError(f"{path!r} is {size} bytes; read_text reads at most {MAX_READ_BYTES}")
    try:
        return target.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise ValueError(f"{path!r} is not UTF-8 text ({e.reason} at byte {e.start})") from None


def list_files() -> list[str]:
    """Relative paths of the files in the data folder, sorted (symlinks leading outside are left out)."""
    root = data_dir().resolve()
    found: list[str] = []
    for folder, _dirs, files in os.walk(root):  # does not descend into symlinked folders
        for name in files:
            full = Path(folder, name)
            if full.resolve().is_relative_to(root) and full.resolve().is_file():
                found.append(full.relative_to(root).as_posix())
    return sorted(found)[:MAX_LISTED_FILES]


def _inside_data_dir(path: object) -> Path:
    """The resolved file a program-supplied path names, if it lies inside the data folder.

    Raises:
        TypeError, ValueError: not a non-empty str.
        PermissionError: absolute, holding ``..``, or resolving (through symlinks) outside the folder.
    """
    if not isinstance(path, str):
        raise TypeError(f"path must be a str, not {type(path).__name__}")
    if not path or "\x00" in path:
        raise ValueError("path must be a non-empty relative path without NUL characters")
    pure = PurePosixPath(path)
    if pure.is_absolute() or Path(path).is_absolute():
        raise PermissionError(f"absolute path {path!r} refused: give a path relative to the data folder")
    if ".." in pure.parts:
        raise PermissionError(f"path {path!r} refused: '..' may not be used to leave the data folder")
    root = data_dir().resolve()
    target = (root / pure).resolve()
    if not target.is_relative_to(root):
        raise PermissionError(f"path {path!r} refused: it leads outside the data folder (through a symlink)")
    return target
