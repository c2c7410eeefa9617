"""``sandfleet sandbox run``: output, JSON, and the command's exit code as the CLI's own."""

from __future__ import annotations

import json

from .helpers import run_cli


def test_run_json_prints_the_result(backend: str) -> None:
    done, left = run_cli(
        "sandbox", "run", "-o", f"backend={backend}", "--json", "--", "python3", "-c", "print(1)"
    )
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert {k: result[k] for k in ("stdout", "stderr", "exit_code", "timed_out")} == {
        "stdout": "1\n",
        "stderr": "",
        "exit_code": 0,
        "timed_out": False,
    }
    assert left == []  # the sandbox is gone when the command returns


def test_exit_code_is_the_commands(docker_engine: object) -> None:
    done, left = run_cli("sandbox", "run", "--", "sh", "-c", "echo out; echo err >&2; exit 3")
    assert done.returncode == 3
    assert done.stdout == "out\n"
    assert done.stderr == "err\n[exit code 3]\n"
    assert left == []


def test_timeout_is_reported_and_exits_1(docker_engine: object) -> None:
    done, left = run_cli("sandbox", "run", "--timeout", "1", "--json", "--", "sleep", "30")
    assert done.returncode == 1
    result = json.loads(done.stdout)
    assert result["timed_out"] is True and result["exit_code"] == -1
    assert result["stderr"] == "Command timed out after 1 seconds; its processes were killed"
    assert left == []


def test_options_after_the_double_dash_belong_to_the_command(docker_engine: object) -> None:
    done, _ = run_cli(
        "sandbox", "run", "--", "python3", "-c", "import sys; print(sys.argv[1:])", "-o", "--json"
    )
    assert done.returncode == 0
    assert done.stdout == "['-o', '--json']\n"


def test_the_one_off_commands_pause_the_collector_while_loading_and_freeze_what_they_loaded() -> None:
    """What ``sandbox run`` and ``run`` do around their imports (cli/common.py): the collector is
    restored as it was, and what was alive is no longer walked by it."""
    import gc

    from sandfleet.worker.cli.common import loading_then_frozen

    gc.unfreeze()
    try:
        with loading_then_frozen():
            assert not gc.isenabled()
            loaded = [object() for _ in range(10)]
        assert gc.isenabled() and gc.get_freeze_count() >= len(loaded)
        gc.disable()
        with loading_then_frozen():
            pass
        assert not gc.isenabled()  # a caller's own choice is kept
    finally:
        gc.unfreeze()
        gc.enable()
