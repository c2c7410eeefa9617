"""Fixtures for the tool tests: a private data folder and throwaway tool modules on disk.

data_dir        function: an empty folder that SANDFLEET_DATA_DIR points at
orders_dir      function: the same, holding the reference orders.csv
write_module    function: write ``name.py`` (dedented source) importable by name; unloaded afterwards
"""

from __future__ import annotations

import sys
import textwrap
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from sandfleet.worker.tools.examples.scenario import write_reference_data


@pytest.fixture
def data_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    folder = tmp_path / "data"
    folder.mkdir()
    monkeypatch.setenv("SANDFLEET_DATA_DIR", str(folder))
    return folder


@pytest.fixture
def orders_dir(data_dir: Path) -> Path:
    write_reference_data(data_dir)
    return data_dir


@pytest.fixture
def write_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[[str, str], Path]]:
    folder = tmp_path / "modules"
    folder.mkdir()
    monkeypatch.syspath_prepend(str(folder))
    written: list[str] = []

    def write(name: str, source: str) -> Path:
        path = folder / f"{name}.py"
        path.write_text(textwrap.dedent(source))
        written.append(name)
        return path

    yield write
    for name in written:
        sys.modules.pop(name, None)
