"""``pip install .`` into a fresh virtual environment installs one top-level package, ``sandfleet``.

Two generic top-level names (``producer``, ``worker``) used to collide with other projects' modules.
The wheel is built from this checkout; the fresh venv gets it with ``--no-deps`` (what is checked is
the package's shape, not its dependencies), and is inspected from a folder outside the repository so
the checkout's own folders are not on ``sys.path``.
"""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(out), str(ROOT)],
        check=True,
        timeout=300,
        capture_output=True,
    )
    [built] = out.glob("sandfleet-*.whl")
    return built


def test_the_wheel_holds_only_the_sandfleet_namespace(wheel: Path) -> None:
    names = zipfile.ZipFile(wheel).namelist()
    tops = {name.split("/")[0] for name in names}
    assert {t for t in tops if not t.endswith(".dist-info")} == {"sandfleet"}
    top_level = next(n for n in names if n.endswith(".dist-info/top_level.txt"))
    assert zipfile.ZipFile(wheel).read(top_level).decode().split() == ["sandfleet"]
    # The files the worker reads at run time, and the marker that the package is typed.
    assert "sandfleet/worker/engine/prompts/system.txt" in names
    assert "sandfleet/worker/sandbox/inside/tools_stub.py" in names
    assert "sandfleet/py.typed" in names
    assert "sandfleet/producer/client.py" in names and "sandfleet/core/contracts.py" in names


def test_a_fresh_venv_imports_sandfleet_and_nothing_else(wheel: Path, tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    # No pip inside (ensurepip took most of this test's time): this venv's pip installs into it.
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    python = venv / "bin" / "python"
    site = Path(
        subprocess.run(
            [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            check=True,
            capture_output=True,
            text=True,
        ).stdout.strip()
    )
    before = {p.name for p in site.iterdir()}
    subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(python), "install", "-q", "--no-deps", str(wheel)],
        check=True,
        timeout=300,
    )
    added = {p.name for p in site.iterdir()} - before
    assert {a for a in added if not a.endswith(".dist-info") and a != "__pycache__"} == {"sandfleet"}
    probe = (
        "import importlib.util, sandfleet; "
        "print(sandfleet.__version__, sandfleet.__file__); "
        "print([m for m in ('worker', 'producer', 'core') if importlib.util.find_spec(m) is not None])"
    )
    shown = subprocess.run(
        [python, "-c", probe], cwd=tmp_path, check=True, capture_output=True, text=True
    ).stdout.split("\n")
    version, location = shown[0].split()
    assert version == "0.2.0" and location.startswith(str(site))
    assert shown[1] == "[]"  # `import worker` and `import producer` fail
    failed = subprocess.run([python, "-c", "import worker"], cwd=tmp_path, capture_output=True, text=True)
    assert failed.returncode == 1 and "No module named 'worker'" in failed.stderr
