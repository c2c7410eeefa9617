"""Where the example tools find their data: ``settings.data_dir`` (``SANDFLEET_DATA_DIR``).

Read on every call (settings are cheap to build) so tests and the demo can repoint it.
"""

from __future__ import annotations

from pathlib import Path

from sandfleet.core.settings import Settings

DEFAULT_DATA_DIR = Settings.model_fields["data_dir"].default


def data_dir() -> Path:
    """The data folder, user-expanded (it may not exist yet)."""
    return Path(Settings().data_dir).expanduser()
