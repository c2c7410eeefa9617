"""Running a program: the deadline kills everything it started, the RESULT line, output caps."""

from __future__ import annotations

from typing import Any

import pytest

from .helpers import container_gone, program


def test_timeout_kills_children_and_grandchildren(backend: str, run: Any, docker_client: Any) -> None:
    source = program("""
        import subprocess, time
        subprocess.Popen(["sleep", "300"])
        subprocess.Popen(["python3", "-c", "import time; time.sleep(300)"], start_new_session=True)
        print("started", flush=True)
        time.sleep(300)
        print("RESULT: never")
    """)

    done = run(source, backend=backend, exec_timeout=2)

    assert done.timed_out and not done.ok and done.exit_code == -1
    assert "timeout" in done.limits_hit
    assert "timed out" in done.failure()
    assert done.stdout.startswith("started")
    assert done.timings["total_s"] < 2 + 5, "the deadline, not the sleeps, ended the run"
    assert container_gone(docker_client, done.container_id), "the container outlived its run"


def test_no_result_line_is_reported(run: Any) -> None:
    done = run("print('the answer is 42')\n")

    assert done.exit_code == 0 and not done.result_found and done.result is None
    assert not done.ok
    assert done.failure() == "the program printed no line starting with 'RESULT:'"


@pytest.mark.parametrize(
    "line,payload,text",
    [
        ('RESULT: {"a": [1, 2.5, null]}', {"a": [1, 2.5, None]}, '{"a": [1, 2.5, null]}'),
        ("RESULT: 42", 42, "42"),
        ("RESULT: North America leads", "North America leads", "North America leads"),
        ("RESULT:   spaced out  ", "spaced out", "spaced out"),
    ],
)
def test_result_json_or_text(run: Any, line: str, payload: Any, text: str) -> None:
    done = run(f"print({line!r})\n")

    assert done.ok and done.failure() is None
    assert done.result == payload and done.result_text == text


def test_the_last_result_line_wins(run: Any) -> None:
    source = program("""
        print("RESULT: 1")
        print("noise")
        print('RESULT: {"final": true}')
        print("more noise, not a result: RESULT: 3")
    """)

    done = run(source)

    assert done.ok and done.result == {"final": True}


def test_stdout_is_capped_and_a_late_result_still_found(run: Any) -> None:
    source = program("""
        import sys
        line = "y" * 1023 + "\\n"
        for _ in range(5 * 1024):
            sys.stdout.write(line)
        print('RESULT: {"after": "5 MB"}')
    """)

    done = run(source)

    assert done.ok, (done.failure(), done.stderr[-500:])
    assert done.stdout_truncated and "output" in done.limits_hit
    assert len(done.stdout.encode()) <= 1024**2
    assert done.result == {"after": "5 MB"}


def test_a_crash_keeps_its_traceback_and_exit_code(run: Any) -> None:
    done = run("print('RESULT: 1')\nraise SystemExit(3)\n")

    assert done.exit_code == 3 and done.result_found and not done.ok
    assert done.failure() == "the program exited with code 3"
