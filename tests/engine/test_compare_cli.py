"""``sandfleet compare`` and ``sandfleet ask --mode chat`` as real processes, with the demo's replay script:
the reference question as code-action (sandboxed) beside chat (the baseline), checked against the totals."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from sandfleet.core.contracts import JobResult, JobStatus
from sandfleet.fleet.demo import REFERENCE_CHAT_TOTALS, demo_replay_script
from sandfleet.worker.tools.examples.scenario import REFERENCE_ANSWER, REFERENCE_QUESTION

from .helpers import CLI_TIMEOUT_S, SANDFLEET, clean_env

ORDERS = "sandfleet.worker.tools.examples.orders"


@pytest.fixture
def demo_script(tmp_path: Path) -> Path:
    path = tmp_path / "demo.json"
    path.write_text(json.dumps(demo_replay_script()))
    return path


def sandfleet(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(SANDFLEET), *args], env=env, capture_output=True, text=True, timeout=CLI_TIMEOUT_S
    )


def test_compare_shows_both_answers_and_which_matches(
    docker_engine: object, orders_dir: Path, demo_script: Path, tmp_path: Path
) -> None:
    expected = tmp_path / "expected.json"
    expected.write_text(json.dumps(REFERENCE_ANSWER))
    env = clean_env(SANDFLEET_DATA_DIR=str(orders_dir))
    args = (
        REFERENCE_QUESTION,
        "--tools",
        ORDERS,
        "--model",
        f"replay:{demo_script}",
        "--expect",
        str(expected),
    )

    done = sandfleet("compare", *args, "--json", env=env)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    code_action, chat = report["jobs"]
    assert (code_action["mode"], chat["mode"]) == ("code-action", "chat")
    assert code_action["status"] == chat["status"] == "succeeded"
    assert code_action["answer"] == REFERENCE_ANSWER and code_action["matches"] is True
    assert chat["answer"] == REFERENCE_CHAT_TOTALS and chat["matches"] is False
    assert chat["check"] == (
        "NO: 2 of 4 wrong: North America 109,555 (expected 108,664); LATAM 79,585 (expected 81,328)"
    )
    assert code_action["model_calls"] == 1 and chat["model_calls"] == 2
    assert code_action["tool_calls"] == chat["tool_calls"] == 1  # the same tool, once each
    assert chat["prompt_tokens"] > code_action["prompt_tokens"]  # the chat model read all 500 rows

    done = sandfleet("compare", *args, env=env)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].split() == ["code-action", "chat"]
    assert lines[1].split() == ["status", "succeeded", "succeeded"]
    assert "matches      yes                     NO" in done.stdout
    assert "chat matches the expected answer: NO: 2 of 4 wrong" in done.stdout


def test_ask_in_chat_mode_runs_no_sandbox(orders_dir: Path, demo_script: Path) -> None:
    env = clean_env(SANDFLEET_DATA_DIR=str(orders_dir), DOCKER_HOST="unix:///nonexistent.sock")
    args = (REFERENCE_QUESTION, "--tools", ORDERS, "--model", f"replay:{demo_script}", "--mode", "chat")
    done = sandfleet("ask", *args, env=env)
    assert done.returncode == 0, done.stderr  # no Docker engine answers here: none is needed
    assert json.loads(done.stdout) == REFERENCE_CHAT_TOTALS
    done = sandfleet("ask", *args, "--json", env=env)
    result = JobResult.model_validate_json(done.stdout)
    assert result.status == JobStatus.SUCCEEDED and result.mode == "chat" and result.turns[0].calls[0].ok
    # code-action never falls back to the host: with no engine it refuses.
    code_action = sandfleet("ask", *args[:-2], env=env)
    assert code_action.returncode != 0 and "not available" in code_action.stderr
