"""``sandfleet model-server`` as a real process: it prints its URL, serves, and stops on SIGTERM."""

from __future__ import annotations

import json
import selectors
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import openai
import pytest

from .helpers import user

SANDFLEET = Path(sys.executable).parent / "sandfleet"
START_TIMEOUT_S = 30.0


def first_line(process: subprocess.Popen[str], timeout_s: float) -> str:
    """The first line the process prints, or fail with its stderr."""
    assert process.stdout is not None
    with selectors.DefaultSelector() as selector:
        selector.register(process.stdout, selectors.EVENT_READ)
        if not selector.select(timeout_s):
            pytest.fail(f"model-server printed nothing within {timeout_s} s")
    line = process.stdout.readline().strip()
    if not line:
        stderr = process.stderr.read() if process.stderr else ""
        pytest.fail(f"model-server exited ({process.wait()}) without a URL: {stderr}")
    return line


@pytest.fixture
def run_server() -> Iterator[Callable[..., subprocess.Popen[str]]]:
    processes: list[subprocess.Popen[str]] = []

    def run(*args: str) -> subprocess.Popen[str]:
        process = subprocess.Popen(
            [str(SANDFLEET), "model-server", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        processes.append(process)
        return process

    yield run
    for process in processes:
        if process.poll() is None:
            process.kill()
        process.communicate(timeout=10)


def test_the_command_serves_the_script_until_terminated(
    write_script: Callable[..., Path], run_server: Callable[..., subprocess.Popen[str]]
) -> None:
    script = write_script({"rules": [{"match": "ping", "responses": ["pong"]}]}, fmt="yaml")
    process = run_server("--script", str(script), "--port", "0", "--latency", "0.1")
    base_url = first_line(process, START_TIMEOUT_S)
    assert base_url.startswith("http://127.0.0.1:")
    assert base_url.endswith("/v1")
    assert not base_url.endswith(":0/v1")
    with openai.OpenAI(base_url=base_url, api_key="unused", max_retries=0, timeout=30) as client:
        reply = client.chat.completions.create(model="m", messages=[user("ping")])  # type: ignore[list-item]
        assert reply.choices[0].message.content == "pong"
        assert [m.id for m in client.models.list().data] == ["replay"]
    process.terminate()
    assert process.wait(timeout=10) == 0


def test_json_output_names_the_base_url(
    write_script: Callable[..., Path], run_server: Callable[..., subprocess.Popen[str]]
) -> None:
    process = run_server("--script", str(write_script({"default": ["x"]})), "--port", "0", "--json")
    printed = json.loads(first_line(process, START_TIMEOUT_S))
    assert printed["base_url"].startswith("http://127.0.0.1:")
    process.terminate()
    assert process.wait(timeout=10) == 0


def test_a_bad_script_is_a_clear_error(
    write_script: Callable[..., Path], run_server: Callable[..., subprocess.Popen[str]]
) -> None:
    script = write_script({"rules": [{"match": "(", "responses": ["x"]}]})
    process = run_server("--script", str(script), "--port", "0")
    _, stderr = process.communicate(timeout=START_TIMEOUT_S)
    assert process.returncode != 0
    assert "bad regular expression" in stderr
