"""Recipes, plans and command lines of the image builds: pure, no Docker."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from sandfleet.core.errors import SandboxError
from sandfleet.worker.images import build as images
from sandfleet.worker.images.build import (
    BASE_TAG,
    DATA_SCIENCE_TAG,
    LABEL_RECIPE,
    PYTHON_SLIM_IMAGE,
    SANDBOX_TAG,
    DebootstrapParams,
    base_recipe,
    build_command,
    debootstrap_command,
    import_command,
    mirror_from_apt_sources,
    plan_images,
)


@pytest.fixture
def recipes_dir(tmp_path: Path) -> Path:
    """A copy of deploy/images that a test may edit."""
    return Path(shutil.copytree(images.RECIPES_DIR, tmp_path / "images"))


def by_name(steps: list[images.ImageStep]) -> dict[str, images.ImageStep]:
    return {step.name: step for step in steps}


def test_plan_builds_parents_first_with_tags() -> None:
    steps = plan_images(data_science=True)
    assert [(s.name, s.tag) for s in steps] == [
        ("base", BASE_TAG),
        ("sandbox", SANDBOX_TAG),
        ("sandbox-ds", DATA_SCIENCE_TAG),
    ]
    assert [s.name for s in plan_images()] == ["base", "sandbox"]


def test_recipe_changes_when_the_dockerfile_changes(recipes_dir: Path) -> None:
    before = by_name(plan_images(data_science=True, recipes_dir=recipes_dir))
    dockerfile = recipes_dir / "sandbox" / "Dockerfile"
    dockerfile.write_text(dockerfile.read_text() + "\nRUN true\n")
    after = by_name(plan_images(data_science=True, recipes_dir=recipes_dir))
    assert after["base"].recipe == before["base"].recipe
    assert after["sandbox"].recipe != before["sandbox"].recipe
    assert after["sandbox-ds"].recipe != before["sandbox-ds"].recipe  # its parent changed


def test_recipe_is_stable_and_follows_the_base() -> None:
    assert plan_images() == plan_images()
    fewer = by_name(plan_images(params=DebootstrapParams(include=("python3",))))
    assert fewer["base"].recipe != by_name(plan_images())["base"].recipe
    assert fewer["sandbox"].recipe != by_name(plan_images())["sandbox"].recipe


def test_mirror_is_not_part_of_the_recipe() -> None:
    assert base_recipe(DebootstrapParams(mirror="http://a.example/debian")) == base_recipe(
        DebootstrapParams(mirror="http://b.example/debian")
    )


def test_debootstrap_command() -> None:
    params = DebootstrapParams(mirror="http://mirror.example/debian")
    assert debootstrap_command(params, Path("/var/tmp/x/rootfs")) == [
        "debootstrap",
        "--variant=minbase",
        "--include=python3,ca-certificates",
        "bookworm",
        "/var/tmp/x/rootfs",
        "http://mirror.example/debian",
    ]
    with_key = DebootstrapParams(keyring="/usr/share/keyrings/debian-archive-keyring.gpg")
    assert "--keyring=/usr/share/keyrings/debian-archive-keyring.gpg" in debootstrap_command(
        with_key, Path("/r")
    )


def test_import_command_labels_the_base() -> None:
    base = plan_images()[0]
    cmd = import_command(base)
    assert cmd[:2] == ["docker", "import"]
    assert cmd[-2:] == ["-", BASE_TAG]
    assert f"LABEL {LABEL_RECIPE}={base.recipe}" in cmd


def test_sandbox_build_command_on_the_local_base() -> None:
    sandbox = by_name(plan_images())["sandbox"]
    cmd = build_command(sandbox)
    dockerfile = images.RECIPES_DIR / "sandbox" / "Dockerfile"
    assert cmd == [
        "docker", "build", "--force-rm",
        "--build-arg", f"BASE_IMAGE={BASE_TAG}",
        "--label", f"{LABEL_RECIPE}={sandbox.recipe}",
        "-t", SANDBOX_TAG, "-f", str(dockerfile), str(dockerfile.parent),
    ]  # fmt: skip


def test_python_slim_recipe_builds_from_the_registry_image() -> None:
    """The --base python-slim path cannot run without a registry; check what it would run."""
    steps = by_name(plan_images(base="python-slim", data_science=True))
    assert "base" not in steps
    sandbox_cmd = build_command(steps["sandbox"])
    assert ["--build-arg", f"BASE_IMAGE={PYTHON_SLIM_IMAGE}"] == sandbox_cmd[3:5]
    assert sandbox_cmd[sandbox_cmd.index("-t") + 1] == SANDBOX_TAG
    ds_cmd = build_command(steps["sandbox-ds"])
    assert "DS_PACKAGES_FROM=pip" in ds_cmd
    assert f"SANDBOX_IMAGE={SANDBOX_TAG}" in ds_cmd
    assert steps["sandbox"].recipe != by_name(plan_images())["sandbox"].recipe


def test_dockerfile_copes_with_python_in_usr_local() -> None:
    text = (images.RECIPES_DIR / "sandbox" / "Dockerfile").read_text()
    assert "ARG BASE_IMAGE=sandfleet/base:bookworm" in text
    assert 'ln -s "$(command -v python3)" /usr/bin/python3' in text
    assert "\nUSER" not in text  # the sandbox picks the user at run time


def test_unknown_base_is_refused() -> None:
    with pytest.raises(SandboxError, match="debian, python-slim"):
        plan_images(base="alpine")


@pytest.mark.parametrize(
    ("texts", "expected"),
    [
        (
            ["Types: deb\nURIs: http://deb.debian.org/debian\nSuites: bookworm\n"],
            "http://deb.debian.org/debian",
        ),
        (
            ["# comment\ndeb [arch=amd64] http://ftp.de.debian.org/debian/ bookworm main\n"],
            "http://ftp.de.debian.org/debian",
        ),
        (
            ["URIs: http://deb.debian.org/debian-security\n", "deb http://m.example/debian bookworm main"],
            "http://m.example/debian",
        ),
        (["deb http://archive.ubuntu.com/ubuntu jammy main\n"], None),
        ([], None),
    ],
)
def test_mirror_from_apt_sources(texts: list[str], expected: str | None) -> None:
    assert mirror_from_apt_sources(texts) == expected
