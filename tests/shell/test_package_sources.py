"""Where a shell session may install from, as the pip command says it (pure: no sandbox)."""

from __future__ import annotations

from pathlib import Path

import pytest

from sandfleet.worker.engine.shell.keeper import WHEELHOUSE_INSIDE
from sandfleet.worker.engine.shell.tools import PackageSources


def test_no_network_and_no_wheelhouse_installs_nothing() -> None:
    with pytest.raises(PermissionError, match=r"no network .* no wheelhouse"):
        PackageSources().install_command("attrs")


def test_a_wheelhouse_alone_is_the_only_index(tmp_path: Path) -> None:
    (tmp_path / "pip-23.0-py3-none-any.whl").touch()
    (tmp_path / "pip-24.2-py3-none-any.whl").touch()
    sources = PackageSources("none", tmp_path)
    command = sources.install_command("attrs==23.2.0")
    assert f"python3 -s {WHEELHOUSE_INSIDE}/pip-24.2-py3-none-any.whl/pip " in command  # the newest pip
    assert f"--no-index --find-links {WHEELHOUSE_INSIDE} 'attrs==23.2.0'" in command
    assert sources.used() == "the operator's wheelhouse"


def test_a_restricted_network_uses_the_index_and_the_wheelhouse_beside_it(tmp_path: Path) -> None:
    sources = PackageSources("restricted", tmp_path)
    command = sources.install_command("attrs")
    assert "--no-index" not in command and f"--find-links {WHEELHOUSE_INSIDE} 'attrs'" in command
    assert command.startswith("python3 -s -m pip ")  # the wheelhouse holds no pip wheel
    assert sources.used() == "the package index through the egress proxy"
    assert "--find-links" not in PackageSources("restricted").install_command("attrs")


def test_an_open_network_without_a_wheelhouse_uses_the_index() -> None:
    sources = PackageSources("full")
    assert sources.install_command("attrs").startswith("python3 -s -m pip install ")
    assert sources.used() == "the package index"
