"""sandbox_exec on a real session sandbox, under runc and gVisor: timeouts that kill forked children,
output floods cut to head and tail with their real sizes, a model asking for a 10-hour timeout, a
sandbox killed mid-session, and the session's idle and lifetime caps."""

from __future__ import annotations

import subprocess
import threading
import time
from collections.abc import Callable

import pytest

from sandfleet.core.contracts import Limit
from sandfleet.worker.engine.shell.session import SessionGoneError
from sandfleet.worker.engine.shell.tools import ShellTools

from .helpers import gone, shell_settings

OpenTools = Callable[..., ShellTools]
# Every live process of the sandbox but init, the agent and this lister (and a bash around it), by
# name (Python: `ps` is not in the image, and coreutils' ls fails under this gVisor). Zombies are dead:
# a killed child waits as one until it is reaped (a loaded gVisor run once listed a killed "setsid").
OTHERS = (
    'python3 -c "import os; me = os.getpid(); keep = {{1, {agent}, me, os.getppid()}}; '
    "stat = lambda p: open(f'/proc/{{p}}/stat').read(); "
    "print(sorted(stat(p)[stat(p).index('(') + 1 : stat(p).rindex(')')] for p in os.listdir('/proc') "
    "if p.isdigit() and int(p) not in keep and stat(p).rsplit(')', 1)[1].split()[0] != 'Z'))\""
)


def others(tools: ShellTools) -> str:
    agent = tools.session.container.hello["pid"]
    return tools.sandbox_exec(OTHERS.format(agent=agent))["stdout"].strip()


def test_commands_run_in_the_workspace_and_files_persist(open_tools: OpenTools) -> None:
    tools = open_tools()
    first = tools.sandbox_exec("echo hello > note.txt; cd /tmp; export X=1; echo oops >&2; exit 3")
    assert first["exit_code"] == 3 and first["stderr"] == "oops\n" and not first["timed_out"]
    second = tools.sandbox_exec('cat note.txt; pwd; echo "X=${X:-unset}"')
    assert second["stdout"] == "hello\n/workspace\nX=unset\n"  # files persist; each call is a new bash
    assert second["stdout_bytes"] == len(second["stdout"]) and "note" not in second


def test_a_timeout_kills_the_whole_process_tree(open_tools: OpenTools) -> None:
    tools = open_tools()
    command = (
        "(sleep 300 &) ; setsid sleep 301 & nohup sleep 302 >/dev/null 2>&1 & bash -c 'sleep 303' & sleep 304"
    )
    done = tools.sandbox_exec(command, timeout=2)
    assert done["timed_out"] and done["exit_code"] is None and done["timeout_s"] == 2
    assert "killed at its timeout of 2 s, with every process it started" in done["note"]
    assert others(tools) == "[]"  # the detached, re-parented and new-session children died too


def test_children_left_by_a_finished_command_are_stopped(open_tools: OpenTools) -> None:
    tools = open_tools()
    done = tools.sandbox_exec("setsid sleep 300 >/dev/null 2>&1 < /dev/null & echo started")
    assert done["exit_code"] == 0 and done["stdout"] == "started\n"
    assert others(tools) == "[]"


def test_a_model_asking_for_a_ten_hour_timeout_gets_the_jobs_cap(open_tools: OpenTools) -> None:
    tools = open_tools(exec_timeout=2)
    done = tools.sandbox_exec("sleep 36000", timeout=36000)
    assert done["timed_out"] and done["timeout_s"] == 2
    assert "timeout capped at 2 s (asked 36000 s) by the job's exec_timeout" in done["note"]
    assert others(tools) == "[]"


def test_the_operators_ceiling_caps_what_the_job_allows(open_tools: OpenTools) -> None:
    tools = open_tools(settings=shell_settings(policy_max_exec_timeout_s=1.5), exec_timeout=600)
    done = tools.sandbox_exec("sleep 36000", timeout=36000)
    assert done["timed_out"] and done["timeout_s"] == 1.5
    assert "by the operator's SANDFLEET_POLICY_MAX_EXEC_TIMEOUT_S" in done["note"]


@pytest.mark.parametrize("timeout", [0, -5, "ten", True, float("nan")])
def test_a_bad_timeout_is_refused(open_tools: OpenTools, timeout: object) -> None:
    tools = open_tools()
    with pytest.raises(ValueError, match="timeout must be a number of seconds above 0"):
        tools.sandbox_exec("true", timeout=timeout)  # type: ignore[arg-type]


def test_an_output_flood_keeps_head_and_tail_and_reports_the_sizes(open_tools: OpenTools) -> None:
    tools = open_tools(max_output_bytes=8192)
    command = (
        "echo BEGIN; yes 'a line of output' | head -c 5000000; echo; echo END; yes err | head -c 300000 >&2"
    )
    done = tools.sandbox_exec(command)
    assert done["exit_code"] == 0
    assert done["stdout_bytes"] == 5000000 + len("BEGIN\n\nEND\n") and done["stderr_bytes"] == 300000
    out = done["stdout"]
    assert out.startswith("BEGIN\na line of output\n") and out.endswith(
        "a line of output\na line of o\nEND\n"
    )
    assert "bytes left out: the stream was 5,000,011 bytes; its first 4,096 and last 4,096 are shown" in out
    assert len(out.encode()) < 8192 + 200 and len(done["stderr"].encode()) < 8192 + 200
    assert "output over 8,192 bytes per stream: head and tail kept" in done["note"]


def test_an_endless_flood_is_stopped_at_the_timeout(open_tools: OpenTools) -> None:
    tools = open_tools(max_output_bytes=4096)
    done = tools.sandbox_exec("yes flood", timeout=2)
    assert done["timed_out"] and done["stdout_bytes"] > 1_000_000
    assert done["stdout"].startswith("flood\nflood\n") and len(done["stdout"].encode()) < 4096 + 200
    assert tools.sandbox_exec("echo alive")["stdout"] == "alive\n"  # the session carries on


def kill(container_id: str) -> None:
    subprocess.run(["docker", "kill", container_id], capture_output=True, timeout=60, check=True)


def test_a_sandbox_killed_during_a_command_is_reported_not_waited_for(open_tools: OpenTools) -> None:
    tools = open_tools()
    container_id = tools.session.container.id
    killer = threading.Timer(1.0, kill, [container_id])
    killer.start()
    began = time.monotonic()
    try:
        with pytest.raises(SessionGoneError, match=r"killed .*Its files are lost and no sandbox tool works"):
            tools.sandbox_exec("sleep 60", timeout=60)
    finally:
        killer.join()
    assert time.monotonic() - began < 30  # reported when it died, not at the command's timeout
    # Every later tool says the same at once, without touching the engine.
    for later in (lambda: tools.sandbox_exec("true"), lambda: tools.sandbox_read_file("x")):
        with pytest.raises(SessionGoneError, match="killed"):
            later()
    assert not tools.session.alive and gone(container_id)


def test_a_sandbox_killed_between_calls_is_reported(open_tools: OpenTools) -> None:
    tools = open_tools()
    tools.sandbox_write_file("a.txt", "x")
    kill(tools.session.container.id)
    with pytest.raises(SessionGoneError, match="Its files are lost"):
        tools.sandbox_list_files()
    with pytest.raises(SessionGoneError):
        tools.sandbox_exec("true")


def test_the_idle_cap_destroys_an_unused_session(open_tools: OpenTools) -> None:
    tools = open_tools(idle_s=1.0)
    tools.sandbox_exec("true")
    container_id = tools.session.container.id
    deadline = time.monotonic() + 20
    while tools.session.alive and time.monotonic() < deadline:
        time.sleep(0.2)
    with pytest.raises(SessionGoneError, match=r"idle for 1 s \(its idle cap\)"):
        tools.sandbox_exec("true")
    assert tools.session.record().limits_hit == [Limit.IDLE] and gone(container_id)


def test_the_lifetime_cap_bounds_commands_and_ends_the_session(open_tools: OpenTools) -> None:
    tools = open_tools(lifetime_s=4.0)
    done = tools.sandbox_exec("sleep 60", timeout=60)
    assert done["timed_out"] and done["timeout_s"] < 4
    assert "by the session sandbox's lifetime left" in done["note"]
    deadline = time.monotonic() + 20
    while tools.session.alive and time.monotonic() < deadline:
        time.sleep(0.2)
    with pytest.raises(SessionGoneError, match="lifetime cap of 4 s"):
        tools.sandbox_exec("true")
    assert tools.session.record().limits_hit == [Limit.LIFETIME]
