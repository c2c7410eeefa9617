"""The model client: the real openai client against a real replay server over HTTP, no patching."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from sandfleet.core.errors import InvalidSpecError, ModelError, ModelUnavailableError, TransientError
from sandfleet.core.settings import Settings
from sandfleet.worker.llm.client import ModelReply, ModelTrust, make_model_client
from sandfleet.worker.llm.retry import RetryPolicy
from sandfleet.worker.llm.scripted import server as replay_server
from sandfleet.worker.llm.scripted.registry import parse_replay_spec, shared_replay_server
from sandfleet.worker.llm.scripted.server import ReplayServer

from .helpers import assistant, user

StartServer = Callable[..., ReplayServer]
MakeSettings = Callable[..., Settings]
FAST_RETRY = RetryPolicy(max_retries=2, backoff_base_s=0.01, backoff_max_s=0.05)
OPERATOR = ModelTrust.OPERATOR  # the model names of these tests are their own user's


def test_a_reply_carries_text_usage_latency_and_model(
    start_server: StartServer, make_settings: MakeSettings
) -> None:
    server = start_server({"default": ["print('RESULT: 1')"]}, latency_s=0.2)
    client = make_model_client("openai:gpt-test", make_settings(), base_url=server.base_url)
    assert client.name == "openai:gpt-test"
    reply = client.complete([user("what is one?")])
    assert isinstance(reply, ModelReply)
    assert reply.text == "print('RESULT: 1')"
    assert reply.model == "gpt-test"
    assert reply.prompt_tokens > 0
    assert reply.completion_tokens > 0
    assert reply.latency_s >= 0.2
    assert reply.attempts == 1


def test_429_then_200_is_retried_and_succeeds(start_server: StartServer, make_settings: MakeSettings) -> None:
    server = start_server({"rules": [{"match": "q", "responses": ["answer"], "fail_first": 1}]})
    client = make_model_client("openai:m", make_settings(), base_url=server.base_url, retry=FAST_RETRY)
    reply = client.complete([user("q")])
    assert reply.text == "answer"
    assert reply.attempts == 2
    assert server.stats().requests == 2


def test_500_forever_raises_model_unavailable_after_every_try(
    start_server: StartServer, make_settings: MakeSettings
) -> None:
    server = start_server({"default": [{"status": 500, "error": "the model fell over"}]})
    client = make_model_client("openai:m", make_settings(), base_url=server.base_url, retry=FAST_RETRY)
    with pytest.raises(ModelUnavailableError) as caught:
        client.complete([user("q")])
    assert isinstance(caught.value, TransientError)
    message = str(caught.value)
    assert "HTTP 500" in message
    assert "the model fell over" in message
    assert "after 3 tries" in message
    assert server.stats().requests == FAST_RETRY.max_tries
    assert caught.value.__cause__ is not None


def test_the_retry_count_comes_from_settings(start_server: StartServer, make_settings: MakeSettings) -> None:
    server = start_server({"default": [{"status": 503}]})
    client = make_model_client("openai:m", make_settings(model_max_retries=0), base_url=server.base_url)
    with pytest.raises(ModelUnavailableError, match="after 1 try"):
        client.complete([user("q")])
    assert server.stats().requests == 1


def test_a_400_raises_model_error_without_retry(
    start_server: StartServer, make_settings: MakeSettings
) -> None:
    server = start_server({"default": [{"status": 400, "error": "context length exceeded"}]})
    client = make_model_client("openai:m", make_settings(), base_url=server.base_url, retry=FAST_RETRY)
    with pytest.raises(ModelError, match="HTTP 400: context length exceeded") as caught:
        client.complete([user("q")])
    assert not isinstance(caught.value, TransientError)
    assert server.stats().requests == 1


def test_no_matching_rule_is_a_model_error(start_server: StartServer, make_settings: MakeSettings) -> None:
    server = start_server({"rules": [{"match": "only this", "responses": ["x"]}]})
    client = make_model_client("openai:m", make_settings(), base_url=server.base_url, retry=FAST_RETRY)
    with pytest.raises(ModelError, match="no replay rule matches"):
        client.complete([user("something else")])


def test_a_401_names_the_key_to_check(start_server: StartServer, make_settings: MakeSettings) -> None:
    server = start_server({"default": [{"status": 401, "error": "bad key"}]})
    client = make_model_client("openai:m", make_settings(), base_url=server.base_url, retry=FAST_RETRY)
    with pytest.raises(ModelError, match="OPENAI_API_KEY"):
        client.complete([user("q")])


def test_timeouts_are_retried_then_reported(start_server: StartServer, make_settings: MakeSettings) -> None:
    server = start_server({"default": ["too late"]}, latency_s=2.0)
    settings = make_settings(model_request_timeout_s=0.2)
    retry = RetryPolicy(max_retries=1, backoff_base_s=0.01)
    client = make_model_client("openai:m", settings, base_url=server.base_url, retry=retry)
    with pytest.raises(ModelUnavailableError, match=r"timed out after 0\.2 s"):
        client.complete([user("q")])
    assert server.stats().requests == 2


def test_an_unreachable_endpoint_is_unavailable(make_settings: MakeSettings) -> None:
    with socket.socket() as probe:  # a port that was free a moment ago: nothing listens there
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    client = make_model_client(
        "openai:m", make_settings(), base_url=f"http://127.0.0.1:{port}/v1", retry=FAST_RETRY
    )
    with pytest.raises(ModelUnavailableError, match="cannot connect"):
        client.complete([user("q")])


def test_no_key_and_no_base_url_is_refused_before_any_call(make_settings: MakeSettings) -> None:
    with pytest.raises(InvalidSpecError) as caught:
        make_model_client("openai:gpt-5-mini", make_settings())
    message = str(caught.value)
    for name in ("OPENAI_API_KEY", "OPENAI_BASE_URL", "SANDFLEET_MODEL_BASE_URL"):
        assert name in message


def test_a_key_alone_is_enough_to_make_a_client(make_settings: MakeSettings) -> None:
    client = make_model_client("openai:gpt-5-mini", make_settings(model_api_key="sk-test"))
    assert client.name == "openai:gpt-5-mini"


def test_the_job_base_url_wins_over_the_settings_one(
    start_server: StartServer, make_settings: MakeSettings
) -> None:
    from_settings = start_server({"default": ["from settings"]})
    from_job = start_server({"default": ["from the job"]})
    settings = make_settings(model_base_url=from_settings.base_url)  # no key: a placeholder is sent
    assert make_model_client("openai:m", settings).complete([user("q")]).text == "from settings"
    job_client = make_model_client("openai:m", settings, base_url=from_job.base_url)
    assert job_client.complete([user("q")]).text == "from the job"


def test_openai_base_url_reaches_settings(start_server: StartServer, monkeypatch: pytest.MonkeyPatch) -> None:
    server = start_server({"default": ["via OPENAI_BASE_URL"]})
    monkeypatch.setenv("OPENAI_BASE_URL", server.base_url)
    settings = Settings(model_api_key=None, model_max_retries=0)
    assert make_model_client("openai:m", settings).complete([user("q")]).text == "via OPENAI_BASE_URL"


@pytest.mark.parametrize(
    ("model", "expected"),
    [
        ("anthropic:claude", r"unknown model provider 'anthropic'.*known providers: openai, replay"),
        ("gpt-5-mini", r"must be provider:model.*openai, replay"),
        ("openai:", r"must be provider:model"),
        (":gpt", r"must be provider:model"),
    ],
)
def test_bad_model_names_are_refused(model: str, expected: str, make_settings: MakeSettings) -> None:
    with pytest.raises(InvalidSpecError, match=expected):
        make_model_client(model, make_settings(model_api_key="sk-test"))


def test_a_replay_model_starts_one_server_and_reuses_it(
    write_script: Callable[..., Path], make_settings: MakeSettings, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = write_script({"rules": [{"match": "revenue", "responses": ["first", "second"]}]}, fmt="yaml")
    first = make_model_client(f"replay:{path}", make_settings(), trust=OPERATOR)
    assert first.name == f"replay:{path}"
    assert first.complete([user("revenue?")]).text == "first"
    monkeypatch.chdir(path.parent)
    again = make_model_client(f"replay:{path.name}", make_settings(), trust=OPERATOR)  # relative: the same
    assert again.complete([user("revenue?"), assistant("first"), user("broken")]).text == "second"
    server = shared_replay_server(str(path), trust=OPERATOR)
    assert server is shared_replay_server(path.name, trust=OPERATOR)
    assert server.stats().requests == 2


class _CountedSleeps:
    """The replay server's ``time`` module, with each ``sleep`` noted before it sleeps."""

    def __init__(self, slept: list[float]) -> None:
        self.slept = slept

    def __getattr__(self, name: str) -> Any:
        return getattr(time, name)

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        time.sleep(seconds)


def test_a_replay_model_takes_a_latency_per_request_from_one_server(
    write_script: Callable[..., Path], make_settings: MakeSettings, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = write_script({"default": ["slow"]})
    slept: list[float] = []
    monkeypatch.setattr(replay_server, "time", _CountedSleeps(slept))  # counted, not timed
    reply = make_model_client(f"replay:{path}?latency=0.3", make_settings(), trust=OPERATOR).complete(
        [user("q")]
    )
    assert reply.text == "slow"
    assert reply.latency_s >= 0.3
    fast = make_model_client(f"replay:{path}", make_settings(), trust=OPERATOR).complete([user("q")])
    assert fast.text == "slow" and slept == [0.3]  # the second request, without the latency, waited not
    server = shared_replay_server(str(path), trust=OPERATOR)
    assert server.stats().requests == 2  # both names were answered by the one server
    sent = [r.get("model") for r in server.requests()]
    assert sent == ["replay", "replay"]


def test_distinct_latencies_start_no_thread_and_no_server(
    write_script: Callable[..., Path], make_settings: MakeSettings
) -> None:
    """Every distinct ``?latency=`` used to start a server (a thread and a port each): a job could
    grow a worker's threads without bound by varying it."""
    path = write_script({"default": ["x"]})
    make_model_client(f"replay:{path}", make_settings(), trust=OPERATOR).complete([user("q")])
    threads = threading.active_count()
    for i in range(1, 31):
        reply = make_model_client(f"replay:{path}?latency=0.00{i}", make_settings(), trust=OPERATOR)
        assert reply.complete([user("q")]).text == "x"
    assert threading.active_count() <= threads
    assert shared_replay_server(str(path), trust=OPERATOR).stats().requests == 31


def test_a_replay_model_named_by_the_operator_is_checked_before_any_call(
    tmp_path: Path, write_script: Callable[..., Path], make_settings: MakeSettings
) -> None:
    """The operator's own file: the errors say exactly what is wrong (it is their file)."""
    with pytest.raises(InvalidSpecError, match="cannot read replay script"):
        make_model_client(f"replay:{tmp_path / 'absent.yaml'}", make_settings(), trust=OPERATOR)
    bad = write_script({"rules": [{"match": "(", "responses": ["x"]}]})
    with pytest.raises(InvalidSpecError, match="bad regular expression"):
        make_model_client(f"replay:{bad}", make_settings(), trust=OPERATOR)
    good = write_script({"default": ["x"]})
    with pytest.raises(InvalidSpecError, match="takes no base URL"):
        make_model_client(f"replay:{good}", make_settings(), trust=OPERATOR, base_url="http://127.0.0.1:1/v1")


def test_a_replay_model_is_a_jobs_unless_the_caller_says_otherwise(
    write_script: Callable[..., Path], make_settings: MakeSettings
) -> None:
    """The factory's default is the strict rule: a caller that forgets to say fails closed."""
    good = write_script({"default": ["x"]})
    with pytest.raises(InvalidSpecError, match="SANDFLEET_REPLAY_SCRIPTS_DIR is not set"):
        make_model_client(f"replay:{good}", make_settings())
    inside = make_model_client(f"replay:{good.name}", make_settings(replay_scripts_dir=str(good.parent)))
    assert inside.complete([user("q")]).text == "x"


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ("s.yaml?latency=-1", "latency must be a number"),
        ("s.yaml?latency=soon", "latency must be a number"),
        ("s.yaml?latency=nan", "latency must be a number"),
        ("s.yaml?latency=61", "latency must be a number of seconds from 0 to 60"),
        ("s.yaml?latency=inf", "latency must be a number"),
        ("s.yaml?speed=2", "unknown option 'speed'"),
        ("?latency=1", "needs a script file"),
    ],
)
def test_bad_replay_specs_are_refused(spec: str, expected: str) -> None:
    with pytest.raises(InvalidSpecError, match=expected):
        parse_replay_spec(spec)


def test_a_replay_spec_keeps_its_name_as_written() -> None:
    """Resolving the name is the caller's, by who wrote it (sandfleet/worker/llm/scripted/access.py)."""
    assert parse_replay_spec("s.yaml?latency=0.5") == ("s.yaml", 0.5)
    assert parse_replay_spec("../s.yaml") == ("../s.yaml", None)


def test_latency_is_measured_around_the_call(start_server: StartServer, make_settings: MakeSettings) -> None:
    server = start_server({"default": ["x"]}, latency_s=0.25)
    client = make_model_client("openai:m", make_settings(), base_url=server.base_url)
    started = time.monotonic()
    reply = client.complete([user("q")])
    assert 0.25 <= reply.latency_s <= time.monotonic() - started
