"""deploy/constraints.txt pins what the bootstrap installs (the set CI last passed with), so a release
upstream cannot fail a clean-clone CI unseen. A dependency added to pyproject.toml without a pin
there would be installed at whatever version is newest: this test names it."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
NAME = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)")


def normalised(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def required() -> set[str]:
    """Every distribution pyproject.toml asks for (dependencies and each extra's), but itself."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    lines = list(project["dependencies"])
    for extra in project["optional-dependencies"].values():
        lines.extend(extra)
    names = {normalised(m.group(1)) for line in lines if (m := NAME.match(line))}
    return names - {normalised(project["name"])}


def pinned() -> dict[str, str]:
    pins = {}
    for line in (ROOT / "deploy" / "constraints.txt").read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            name, _, version = line.partition("==")
            pins[normalised(name)] = version
    return pins


def test_every_dependency_is_pinned_to_one_version() -> None:
    pins = pinned()
    missing = sorted(required() - set(pins))
    assert not missing, f"pin these in deploy/constraints.txt (pip freeze of a passing venv): {missing}"


def test_every_line_is_an_exact_pin() -> None:
    loose = [
        name for name, version in pinned().items() if not re.fullmatch(r"[0-9][0-9A-Za-z.+!-]*", version)
    ]
    assert not loose, f"constraints must be name==version: {loose}"


def test_the_reader_sees_extras_and_markers_apart() -> None:
    assert NAME.match("celery[redis]>=5.4,<6").group(1) == "celery"  # type: ignore[union-attr]
    assert normalised("Google_RE2") == "google-re2"
