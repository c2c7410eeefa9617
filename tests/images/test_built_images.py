"""The built sandbox images, run for real, and the --if-changed cache of ``sandfleet images build``."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from sandfleet.worker.images.build import DATA_SCIENCE_TAG, LABEL_RECIPE, SANDBOX_TAG, plan_images

SANDFLEET = str(Path(sys.executable).parent / "sandfleet")
PROBE = """
import json, os, pwd, shutil, sys, importlib.util
print(json.dumps({
    "uid": os.getuid(), "gid": os.getgid(), "user": pwd.getpwuid(os.getuid()).pw_name,
    "home": pwd.getpwuid(os.getuid()).pw_dir, "cwd": os.getcwd(),
    "workspace_owner": [os.stat("/workspace").st_uid, os.stat("/workspace").st_gid],
    "version": list(sys.version_info[:2]), "executable": sys.executable,
    "sudo": shutil.which("sudo"), "pip": importlib.util.find_spec("pip") is not None,
    "apt_lists": os.listdir("/var/lib/apt/lists") if os.path.isdir("/var/lib/apt/lists") else [],
}))
"""


def run_in(image: str, *cmd: str, user: str = "10001:10001") -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["docker", "run", "--rm", "--network", "none", "--user", user, image, *cmd],
        capture_output=True,
        text=True,
        timeout=120,
    )


def inspect(tag: str) -> dict | None:
    proc = subprocess.run(["docker", "image", "inspect", tag], capture_output=True, text=True)
    return json.loads(proc.stdout)[0] if proc.returncode == 0 else None


@pytest.fixture(scope="module")
def sandbox_image(docker_engine) -> str:
    """The sandbox image, built first if this host lacks it (a no-op after the bootstrap)."""
    if SANDBOX_TAG not in docker_engine.images:
        subprocess.run([SANDFLEET, "images", "build", "--if-changed"], check=True, timeout=1200)
    return SANDBOX_TAG


def test_sandbox_image_runs_python_311_as_the_sandbox_user(sandbox_image: str) -> None:
    proc = run_in(sandbox_image, "python3", "-c", PROBE)
    assert proc.returncode == 0, proc.stderr
    facts = json.loads(proc.stdout)
    assert facts["uid"] == 10001 and facts["gid"] == 10001
    assert facts["user"] == "sandbox" and facts["home"] == "/workspace"
    assert facts["cwd"] == "/workspace"
    assert facts["workspace_owner"] == [10001, 10001]
    assert facts["version"] == [3, 11]
    assert facts["executable"] == "/usr/bin/python3"
    assert facts["sudo"] is None
    assert facts["pip"] is False  # standard library only
    assert [name for name in facts["apt_lists"] if name not in ("partial", "auxfiles", "lock")] == []


def test_python3_version(sandbox_image: str) -> None:
    proc = run_in(sandbox_image, "python3", "--version")
    assert proc.returncode == 0
    assert proc.stdout.startswith("Python 3.11.")


def test_image_leaves_the_user_to_the_sandbox_and_carries_its_recipe(sandbox_image: str) -> None:
    data = inspect(sandbox_image)
    assert data is not None
    assert data["Config"]["User"] in ("", "0", "root")
    assert data["Config"]["Labels"][LABEL_RECIPE] == plan_images()[1].recipe
    assert (
        run_in(sandbox_image, "python3", "-c", "import os; print(os.getuid())", user="0").stdout.strip()
        == "0"
    )


def test_data_science_image_has_numpy_and_pandas(docker_engine, skip_or_fail: Callable[[str], None]) -> None:
    if DATA_SCIENCE_TAG not in docker_engine.images:
        skip_or_fail(f"{DATA_SCIENCE_TAG} is not built (sandfleet images build --data-science)")
    code = "import numpy, pandas, os; print(os.getuid(), pandas.DataFrame({'a': [1, 2]}).a.sum())"
    proc = run_in(DATA_SCIENCE_TAG, "python3", "-c", code)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["10001", "3"]


def test_if_changed_skips_ready_images(sandbox_image: str) -> None:
    proc = subprocess.run(
        [SANDFLEET, "images", "build", "--if-changed"], capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0, proc.stderr
    rows = [line for line in proc.stdout.splitlines() if line.startswith("sandfleet/")]
    assert len(rows) == 2
    assert all("unchanged, skipped" in row for row in rows)
    assert "built" not in proc.stdout.replace("unchanged", "")


def test_if_changed_json(sandbox_image: str) -> None:
    proc = subprocess.run(
        [SANDFLEET, "images", "build", "--if-changed", "--json"], capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0, proc.stderr
    results = json.loads(proc.stdout)
    assert [(r["tag"], r["status"]) for r in results] == [
        ("sandfleet/base:bookworm", "skipped"),
        (SANDBOX_TAG, "skipped"),
    ]
    assert all(r["size_bytes"] > 10_000_000 and r["size"].endswith("MB") for r in results)


def test_dead_engine_gives_a_clear_error(docker_engine: object, tmp_path: Path) -> None:
    env = {"DOCKER_HOST": f"unix://{tmp_path}/nonexistent.sock", "PATH": "/usr/local/bin:/usr/bin:/bin"}
    proc = subprocess.run(
        [SANDFLEET, "images", "build", "--if-changed"], capture_output=True, text=True, env=env, timeout=60
    )
    assert proc.returncode != 0
    assert "Docker engine not reachable" in proc.stderr
