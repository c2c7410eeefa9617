"""A host's cgroups read and removed on a tree of folders like /sys/fs/cgroup (no Docker, no root
needed): every process below the host's cgroup is found, the deepest folders go first, and a
controller that lacks the cgroup is skipped."""

from __future__ import annotations

from pathlib import Path

import pytest

from sandfleet.fleet import netns


@pytest.fixture
def cgroup_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setattr(netns, "CGROUP_ROOT", tmp_path)
    for controller, tree in {
        "memory": {"sfh-1-2": "10", "sfh-1-2/c1": "11 12", "sfh-1-2/c1/inner": "13", "other": "99"},
        "pids": {"sfh-1-2/c2": "14"},
        "cpu": {"other": "98"},
    }.items():
        for folder, pids in tree.items():
            (tmp_path / controller / folder).mkdir(parents=True)
            (tmp_path / controller / folder / "cgroup.procs").write_text(pids.replace(" ", "\n"))
    return tmp_path


def test_every_process_below_the_hosts_cgroup_is_found_in_every_controller(cgroup_root: Path) -> None:
    assert netns.cgroup_pids("sfh-1-2") == {10, 11, 12, 13, 14}


def test_a_cgroup_that_vanished_is_read_as_empty(cgroup_root: Path) -> None:
    assert netns.cgroup_pids("sfh-9-9") == set()


def test_removal_takes_the_deepest_folders_first(cgroup_root: Path) -> None:
    for procs in cgroup_root.rglob("cgroup.procs"):
        procs.unlink()  # a real cgroup's files go with its folder; here they must go by hand
    netns.remove_cgroup("sfh-1-2")
    assert not (cgroup_root / "memory" / "sfh-1-2").exists()
    assert not (cgroup_root / "pids" / "sfh-1-2").exists()
    assert (cgroup_root / "memory" / "other").is_dir()


@pytest.fixture
def unified_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A cgroup v2 tree: one hierarchy, ``cgroup.controllers`` at its root, no controller folders."""
    monkeypatch.setattr(netns, "CGROUP_ROOT", tmp_path)
    (tmp_path / "cgroup.controllers").write_text("cpu memory pids\n")
    for folder, pids in {
        "sfh-1-2": "10",
        "sfh-1-2/c1": "11 12",
        "sfh-1-2/c1/inner": "13",
        "other": "99",
    }.items():
        (tmp_path / folder).mkdir(parents=True)
        (tmp_path / folder / "cgroup.procs").write_text(pids.replace(" ", "\n"))
    return tmp_path


def test_on_cgroup_v2_the_hosts_one_folder_and_everything_below_it_are_found(unified_root: Path) -> None:
    assert netns.cgroup_dirs("sfh-1-2") == [unified_root / "sfh-1-2"]
    assert netns.cgroup_pids("sfh-1-2") == {10, 11, 12, 13}
    assert netns.cgroup_pids("sfh-9-9") == set()


def test_on_cgroup_v2_removal_takes_the_deepest_folders_first(unified_root: Path) -> None:
    for procs in unified_root.rglob("cgroup.procs"):
        procs.unlink()
    netns.remove_cgroup("sfh-1-2")
    assert not (unified_root / "sfh-1-2").exists()
    assert (unified_root / "other").is_dir()
