"""Every file ARCHITECTURE.md names exists: a map that names missing rooms misleads the newcomer it is
for (it once sent readers to ``worker/job_end.py``, issue 23).

A path is a backticked name with a slash and a ``.py``/``.md``/``.json``/``.toml``/``.yml`` ending, or
a folder ending in ``/``. Short names (``core/store.py``, ``shell/keeper.py``, ``client.py``) are
looked up under the repository and under each room's folder (``BASES``); one that exists nowhere fails.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "ARCHITECTURE.md"
PATH = re.compile(r"`([\w./-]+/(?:[\w.-]+\.(?:py|md|json|toml|yml|txt))?|[\w-]+\.(?:py|md|toml|yml))`")
# Short names are written relative to one of these folders.
BASES = (
    "",
    "sandfleet/",
    "sandfleet/worker/",
    "sandfleet/worker/engine/",
    "sandfleet/worker/sandbox/",
    "sandfleet/worker/sandbox/docker/",
    "sandfleet/worker/sandbox/inside/",
    "sandfleet/worker/mcp/",
    "sandfleet/worker/program/",
    "sandfleet/worker/delivery/",
    "sandfleet/worker/engine/shell/",
    "sandfleet/producer/",
    "sandfleet/fleet/",
)


def named_paths(text: str) -> list[str]:
    return [m.group(1) for m in PATH.finditer(text)]


def missing(text: str) -> list[str]:
    return sorted({p for p in named_paths(text) if not any((ROOT / base / p).exists() for base in BASES)})


def test_every_path_architecture_md_names_exists() -> None:
    gone = missing(DOC.read_text())
    assert not gone, "ARCHITECTURE.md names files that do not exist:\n" + "\n".join(gone)


def test_the_check_sees_a_missing_file() -> None:
    assert missing("see `sandfleet/worker/job_end.py` and `core/store.py`") == ["sandfleet/worker/job_end.py"]
