"""``sandfleet demo``: the pure parts, the replay script in deploy/demo/, and the command end to end."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import redis

from sandfleet.core.settings import Settings
from sandfleet.fleet.demo import (
    REFERENCE_CHAT_TOTALS,
    choose_model,
    demo_replay_script,
    payload_totals,
    totals_match,
)
from sandfleet.worker.engine.extract import extract_program
from sandfleet.worker.tools.examples.scenario import (
    REFERENCE_ANSWER,
    REFERENCE_PROGRAM,
    expected_q3_revenue,
    generate_orders,
)

REPO = Path(__file__).resolve().parents[2]
SANDFLEET = str(Path(sys.executable).with_name("sandfleet"))
DEMO_TIMEOUT_S = 180


def test_reference_answer_is_the_plain_python_computation() -> None:
    assert expected_q3_revenue(generate_orders()) == REFERENCE_ANSWER


def test_deploy_replay_script_is_the_demo_script() -> None:
    """Compose's model server (deploy/demo/replay.json) and the demo answer the same way."""
    on_disk = json.loads((REPO / "deploy/demo/replay.json").read_text())
    assert on_disk == demo_replay_script()


def test_replay_script_answers_the_reference_question_with_the_reference_program() -> None:
    from sandfleet.worker.llm.scripted.script import match_rule, parse_script
    from sandfleet.worker.tools.examples.scenario import REFERENCE_QUESTION

    script = parse_script(demo_replay_script(), source="demo")
    code_action = [
        {"role": "system", "content": "Write ONE program."},
        {"role": "user", "content": REFERENCE_QUESTION},
    ]
    rule = script.rules[match_rule(script, code_action)]
    assert extract_program(rule.responses[0].text) == REFERENCE_PROGRAM


def test_replay_script_answers_a_chat_job_as_the_reference_chat_agent_did() -> None:
    """A tool-loop prompt gets the reference chat agent: one load_orders call, then its (wrong) totals."""
    from sandfleet.worker.engine.prompt import tool_loop_system
    from sandfleet.worker.engine.toolloop import parse_answer
    from sandfleet.worker.llm.scripted.script import match_rule, parse_script
    from sandfleet.worker.tools.examples.scenario import REFERENCE_QUESTION

    script = parse_script(demo_replay_script(), source="demo")
    system = tool_loop_system(shell=False, max_tool_calls=50)
    chat = [{"role": "system", "content": system}, {"role": "user", "content": REFERENCE_QUESTION}]
    calls, answer = script.rules[match_rule(script, chat)].responses
    assert [c.name for c in calls.tool_calls] == ["load_orders"]
    assert parse_answer(answer.text) == REFERENCE_CHAT_TOTALS
    wrong = {r for r, total in REFERENCE_CHAT_TOTALS.items() if total != REFERENCE_ANSWER[r]}
    assert wrong == {"North America", "LATAM"}  # DESIGN.md: two of four wrong


def test_model_choice() -> None:
    bare = Settings(model_api_key=None, model_base_url=None)
    assert choose_model(None, bare) is None  # the replay model
    assert choose_model("openai:gpt-5-mini", bare) == "openai:gpt-5-mini"
    assert choose_model(None, Settings(model_api_key="sk-test")) == "openai:gpt-5-mini"
    assert choose_model(None, Settings(model_base_url="http://127.0.0.1:8000/v1", model="openai:local")) == (
        "openai:local"
    )


@pytest.mark.parametrize(
    "payload",
    [
        REFERENCE_ANSWER,
        [[region, total] for region, total in REFERENCE_ANSWER.items()],
        [{"region": region, "revenue": total} for region, total in REFERENCE_ANSWER.items()],
        {region: round(total + 0.001, 3) for region, total in REFERENCE_ANSWER.items()},
    ],
)
def test_payload_shapes_that_match(payload: object) -> None:
    assert totals_match(payload, REFERENCE_ANSWER)


@pytest.mark.parametrize(
    "payload",
    [
        dict(reversed(list(REFERENCE_ANSWER.items()))),  # not highest first
        {**REFERENCE_ANSWER, "APAC": 65023.5},
        {k: v for k, v in REFERENCE_ANSWER.items() if k != "EMEA"},
        "North America 108664",
        None,
        [{"region": "EMEA"}],
    ],
)
def test_payloads_that_do_not_match(payload: object) -> None:
    assert not totals_match(payload, REFERENCE_ANSWER)


def test_payload_totals_keeps_order() -> None:
    assert payload_totals({"b": 2, "a": 1}) == [("b", 2.0), ("a", 1.0)]


def answers(url: str) -> bool:
    client = redis.Redis.from_url(url, socket_connect_timeout=0.5)
    try:
        return bool(client.ping())
    except redis.RedisError:
        return False
    finally:
        client.close()


def unused_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.slow
@pytest.mark.timeout(DEMO_TIMEOUT_S + 30)
def test_demo_end_to_end(docker_engine, redis_binary, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """``sandfleet demo --compare --json`` with no Redis answering: it starts one, a worker and Flower,
    runs the reference question with the replay model, reports the exact totals beside the chat
    baseline's, and stops what it started."""
    missing_redis = f"redis://127.0.0.1:{unused_port()}/0"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SANDFLEET_", "OPENAI_"))}
    env.update(SANDFLEET_REDIS_URL=missing_redis, TMPDIR=str(tmp_path))
    began = time.monotonic()
    done = subprocess.run(
        [SANDFLEET, "demo", "--compare", "--json"],
        env=env,
        capture_output=True,
        text=True,
        timeout=DEMO_TIMEOUT_S,
    )
    took_s = time.monotonic() - began
    assert done.returncode == 0, f"stdout:\n{done.stdout}\nstderr:\n{done.stderr[-4000:]}"
    report = json.loads(done.stdout)
    assert report["status"] == "succeeded" and report["match"] is True
    assert report["result"] == REFERENCE_ANSWER
    assert list(report["result"].items()) == list(REFERENCE_ANSWER.items())  # highest first
    assert report["expected"] == REFERENCE_ANSWER
    assert report["model"].startswith("replay:")
    assert report["started"] == ["redis", "worker", "flower"]
    assert report["flower_url"].startswith("http://127.0.0.1:") and report["flower_url"].endswith("/tasks")
    assert "Flower  http://127.0.0.1:" in done.stderr
    code_action, chat = report["compare"]
    assert code_action["mode"] == "code-action" and code_action["matches"] is True
    assert code_action["result"] == REFERENCE_ANSWER and code_action["model_calls"] == 1
    assert chat["mode"] == "chat" and chat["status"] == "succeeded" and chat["matches"] is False
    assert chat["result"] == REFERENCE_CHAT_TOTALS and chat["check"].startswith("NO: 2 of 4 wrong")
    # Everything it started is stopped again, and its scratch folder is gone.
    assert not answers(report["redis_url"])
    flower_port = int(report["flower_url"].split(":")[2].split("/")[0])
    with socket.socket() as s:
        assert s.connect_ex(("127.0.0.1", flower_port)) != 0
    assert not [p for p in tmp_path.iterdir() if p.name.startswith("sandfleet-demo-")]
    print(f"sandfleet demo took {took_s:.1f} s")
