"""Where the example tools find their data: ``SANDFLEET_DATA_DIR``, read on every call.

Read through the fleet's settings once they carry ``data_dir``; until then straight from the
environment, so the examples work with either version of ``producer.settings``.
"""

from __future__ import annotations

import os
from pathlib import Path

from producer.settings import Settings

DATA_DIR_ENV = "SANDFLEET_DATA_DIR"
DEFAULT_DATA_DIR = "~/.sandfleet/data"


def data_dir() -> Path:
    """The data folder, user-expanded (it may not exist yet). Read per call so tests can repoint it."""
    configured = getattr(Settings(), "data_dir", None)
    if configured is None:  # Settings without a data_dir field
        configured = os.environ.get(DATA_DIR_ENV) or DEFAULT_DATA_DIR
    return Path(configured).expanduser()
