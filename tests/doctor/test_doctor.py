"""``sandfleet doctor``: the pure parts, then the command on this host and against a dead engine."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from sandfleet.core.settings import Settings
from sandfleet.worker.cli.doctor import (
    Check,
    exit_status,
    hide_password,
    image_checks,
    model_check,
    render_table,
    runtime_checks,
)
from sandfleet.worker.images.build import DATA_SCIENCE_TAG, SANDBOX_TAG

SANDFLEET = str(Path(sys.executable).parent / "sandfleet")
NOBODY_LISTENS = "redis://127.0.0.1:1/0"  # port 1: connection refused at once


def doctor(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [SANDFLEET, "doctor", *args], capture_output=True, text=True, env={**os.environ, **env}, timeout=60
    )


# ---- pure ---------------------------------------------------------------------------------------------


def test_missing_runsc_is_a_warning_unless_required() -> None:
    relaxed = runtime_checks(("io.containerd.runc.v2", "runc"), require_gvisor=False)
    assert [(c.ok, c.required) for c in relaxed] == [(True, True), (False, False)]
    assert exit_status(relaxed) == 0
    assert "apt-get install runsc" in relaxed[1].fix
    assert "io.containerd" not in relaxed[0].detail
    assert exit_status(runtime_checks(("runc",), require_gvisor=True)) == 1


def test_missing_sandbox_image_fails_missing_data_science_image_warns() -> None:
    only_sandbox = image_checks(frozenset({SANDBOX_TAG}))
    assert exit_status(only_sandbox) == 0
    assert only_sandbox[1].fix == "sandfleet images build --data-science"
    none = image_checks(frozenset({DATA_SCIENCE_TAG}))
    assert exit_status(none) == 1
    assert none[0].fix == "sandfleet images build"


def test_table_shows_status_and_fix() -> None:
    table = render_table(
        [
            Check("Docker engine", True, "Docker 20.10"),
            Check("Redis (fleet)", False, "refused", "start redis-server", required=False),
            Check("image x", False, "missing", "sandfleet images build"),
        ]
    )
    lines = table.splitlines()
    assert lines[0].split()[:3] == ["Docker", "engine", "ok"]
    assert "warning" in lines[1] and "fix: start redis-server" in lines[2]
    assert "missing" in lines[3] and "fix: sandfleet images build" in lines[4]


def test_model_endpoint_is_informational() -> None:
    bare = model_check(Settings(model_api_key=None, model_base_url=None))
    assert not bare.ok and not bare.required and "OPENAI_API_KEY" in bare.fix
    assert model_check(Settings(model_api_key="sk-test", model_base_url=None)).detail.endswith("API key set")
    assert "sk-test" not in model_check(Settings(model_api_key="sk-test", model_base_url=None)).detail


def test_redis_password_is_hidden() -> None:
    assert hide_password("redis://:s3cret@host:6379/0") == "redis://:***@host:6379/0"
    assert hide_password("redis://localhost:6379/0") == "redis://localhost:6379/0"


# ---- the command ----------------------------------------------------------------------------------------


def test_doctor_json_on_this_host(docker_engine, redis_server: str) -> None:
    proc = doctor("--json", SANDFLEET_REDIS_URL=redis_server)
    rows = {row["check"]: row for row in json.loads(proc.stdout)}
    for row in rows.values():
        assert set(row) >= {"check", "ok", "detail", "fix"}
    assert rows["Docker SDK"]["ok"] and rows["Docker engine"]["ok"] and rows["runtime runc"]["ok"]
    assert docker_engine.server_version in rows["Docker engine"]["detail"]
    assert rows["Redis (fleet)"]["ok"], rows["Redis (fleet)"]
    assert rows[f"image {SANDBOX_TAG}"]["ok"] is (SANDBOX_TAG in docker_engine.images)
    assert proc.returncode == (0 if SANDBOX_TAG in docker_engine.images else 1)


def test_doctor_table_on_this_host(docker_engine) -> None:
    proc = doctor(SANDFLEET_REDIS_URL=NOBODY_LISTENS)
    assert "Docker engine" in proc.stdout and "runtime runc" in proc.stdout
    redis_line = next(line for line in proc.stdout.splitlines() if line.startswith("Redis"))
    assert "warning" in redis_line  # reported, but the sandbox does not need Redis
    assert proc.returncode == (0 if SANDBOX_TAG in docker_engine.images else 1)
    assert doctor("--require-redis", SANDFLEET_REDIS_URL=NOBODY_LISTENS).returncode == 1


def test_doctor_fails_on_a_dead_engine(tmp_path: Path) -> None:
    proc = doctor(DOCKER_HOST=f"unix://{tmp_path}/nonexistent.sock", SANDFLEET_REDIS_URL=NOBODY_LISTENS)
    assert proc.returncode == 1
    engine_line = next(line for line in proc.stdout.splitlines() if line.startswith("Docker engine"))
    assert "missing" in engine_line and "Docker" in engine_line
    assert "fix:" in proc.stdout
    rows = json.loads(doctor("--json", DOCKER_HOST=f"unix://{tmp_path}/nonexistent.sock").stdout)
    assert next(r for r in rows if r["check"] == "Docker engine")["ok"] is False
