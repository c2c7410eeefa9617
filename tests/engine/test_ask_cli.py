"""``sandfleet ask`` as a real process: the reference scenario end to end, and a missing model key."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sandfleet.core.contracts import JobResult, JobStatus
from sandfleet.worker.scenario import REFERENCE_ANSWER, REFERENCE_PROGRAM, REFERENCE_QUESTION

from .helpers import clean_env, python_block, sandfleet_ask

REFERENCE_STDOUT = '{"North America": 108664.0, "LATAM": 81328.0, "EMEA": 77689.0, "APAC": 65023.0}\n'


@pytest.fixture
def reference_script(tmp_path: Path) -> Path:
    script = {"rules": [{"match": "revenue per region", "responses": [python_block(REFERENCE_PROGRAM)]}]}
    path = tmp_path / "reference.json"
    path.write_text(json.dumps(script))
    return path


@pytest.mark.docker
def test_the_reference_scenario_prints_the_four_totals(
    docker_engine: object, orders_dir: Path, reference_script: Path
) -> None:
    env = clean_env(SANDFLEET_DATA_DIR=str(orders_dir))
    args = (
        REFERENCE_QUESTION,
        "--tools",
        "sandfleet.worker.tools.examples.orders",
        "--model",
        f"replay:{reference_script}",
    )
    done, created = sandfleet_ask(*args, "--show-program", env=env, verbose=True)

    assert done.returncode == 0, done.stderr
    assert done.stdout == REFERENCE_STDOUT  # logging goes to stderr only
    assert json.loads(done.stdout) == REFERENCE_ANSWER
    assert f"--- program ---\n{REFERENCE_PROGRAM}--- end ---" in done.stderr  # --show-program
    # -vv: the engine's debug log lets the user watch what the model wrote and what it did.
    assert f"sandfleet.engine: attempt 1 program:\n{REFERENCE_PROGRAM}" in done.stderr
    assert "sandfleet.engine: attempt 1 exit 0" in done.stderr
    assert len(created) == 1  # one fresh container for the one attempt (and the count works)

    done, _ = sandfleet_ask(*args, "--json", env=env)
    assert done.returncode == 0, done.stderr
    result = JobResult.model_validate_json(done.stdout)
    assert result.status == JobStatus.SUCCEEDED
    assert result.result == REFERENCE_ANSWER and result.repairs == 0
    assert result.attempts[0].result_text == REFERENCE_STDOUT.strip()
    assert result.model == f"replay:{reference_script}"
    assert result.tool_calls == 1 and result.attempts[0].tool_calls[0].tool == "load_orders"


@pytest.mark.docker  # the engine's event log is how the test knows no container was made
def test_no_key_and_no_base_url_is_refused_before_any_sandbox_starts(
    docker_engine: object, orders_dir: Path
) -> None:
    env = clean_env(SANDFLEET_DATA_DIR=str(orders_dir))
    done, created = sandfleet_ask(
        REFERENCE_QUESTION,
        "--tools",
        "sandfleet.worker.tools.examples.orders",
        "--model",
        "openai:gpt-5-mini",
        env=env,
    )

    assert done.returncode != 0
    assert "OPENAI_API_KEY" in done.stderr and "OPENAI_BASE_URL" in done.stderr
    assert "Traceback" not in done.stderr
    assert done.stdout == ""
    assert created == []
