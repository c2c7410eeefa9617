"""The reference scenario (ARCHITECTURE.md) through the runtime: real orders tool, real sandbox, exact answer."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from sandfleet.core.config import CodeActionSettings, SandboxConfig
from sandfleet.worker.tools.examples.scenario import REFERENCE_ANSWER, REFERENCE_PROGRAM, write_reference_data

from .helpers import sandfleet

ORDERS_MODULE = "sandfleet.worker.tools.examples.orders"
EXPECTED = {"North America": 108664.0, "LATAM": 81328.0, "EMEA": 77689.0, "APAC": 65023.0}


@pytest.fixture
def orders_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    folder = tmp_path / "data"
    write_reference_data(folder)
    monkeypatch.setenv("SANDFLEET_DATA_DIR", str(folder))
    return folder


def test_expected_answer_is_the_scenarios(docker_engine: object) -> None:
    assert REFERENCE_ANSWER == EXPECTED


def test_reference_program_gives_the_exact_totals(backend: str, orders_dir: Path, pool: Any) -> None:
    from sandfleet.worker.program.runtime import ProgramRuntime
    from sandfleet.worker.tools.registry import ToolRegistry

    runtime = ProgramRuntime(pool, ToolRegistry.from_modules([ORDERS_MODULE]))
    run = runtime.run(
        REFERENCE_PROGRAM,
        config=SandboxConfig(backend=backend),
        settings=CodeActionSettings(exec_timeout=30),
        tools=["load_orders"],
        job_id="reference",
    )

    assert run.ok, (run.failure(), run.stderr)
    assert run.result == EXPECTED
    assert list(run.result) == list(EXPECTED), "regions highest first"
    assert json.loads(run.result_text) == EXPECTED
    assert run.runtime == ("runsc" if backend == "gvisor" else "runc")
    assert run.forked  # in a fork of the agent's interpreter (tests/sandbox/test_program_in_place.py)
    [call] = run.tool_calls
    assert call.tool == "load_orders" and call.ok and call.result_size > 50_000
    assert len(call.result) == 500


def test_reference_program_through_the_cli(docker_engine: object, orders_dir: Path, tmp_path: Path) -> None:
    path = tmp_path / "prog.py"
    path.write_text(REFERENCE_PROGRAM)

    done = sandfleet("run", str(path), "--tools", ORDERS_MODULE, env={"SANDFLEET_DATA_DIR": str(orders_dir)})

    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == EXPECTED
    assert list(json.loads(done.stdout)) == list(EXPECTED)


def test_cli_json_gives_the_whole_run(docker_engine: object, orders_dir: Path, tmp_path: Path) -> None:
    path = tmp_path / "prog.py"
    path.write_text(REFERENCE_PROGRAM)

    done = sandfleet("run", str(path), "--tools", ORDERS_MODULE, "--json", "--max-tool-calls", "1")

    assert done.returncode == 0, done.stderr
    run = json.loads(done.stdout)
    assert run["result"] == EXPECTED and run["exit_code"] == 0 and run["result_found"]
    assert [c["tool"] for c in run["tool_calls"]] == ["load_orders"]
    assert set(run["timings"]) >= {"acquire_s", "files_s", "start_s", "run_s", "tool_s", "total_s"}
