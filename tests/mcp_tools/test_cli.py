"""The commands with MCP servers: ``sandfleet tools``, ``doctor``, ``run``, ``ask`` and ``worker``
with ``--mcp-config`` (real processes, real servers)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from .helpers import LAB, ODD, stdio, third_party, write_config

SANDFLEET = str(Path(sys.executable).with_name("sandfleet"))
ORDERS_MODULE = "sandfleet.worker.tools.examples.orders"


def sandfleet(*args: str, timeout: float = 120, **env: str) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("SANDFLEET_")}
    return subprocess.run(
        [SANDFLEET, *args], capture_output=True, text=True, timeout=timeout, env={**clean, **env}
    )


@pytest.fixture
def config(tmp_path: Path, lab_data: Path) -> Path:
    return write_config(
        tmp_path,
        {
            "time": third_party("mcp-server-time", "--local-timezone", "UTC"),
            "odd": stdio(ODD),
            "orders": stdio(LAB, "--data", str(lab_data), env={"LAB_SECRET": "hidden-value"}),
            "old": {"command": "never-started", "disabled": True},
        },
    )


def test_tools_lists_python_and_mcp_tools_with_source_signature_and_description(config: Path) -> None:
    done = sandfleet("tools", "--tools", ORDERS_MODULE, "--mcp-config", str(config))
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert (
        "load_orders  (python:sandfleet.worker.tools.examples.orders)\n    load_orders() -> list[dict]\n"
        in out
    )
    assert (
        "time__convert_time  (mcp:time)\n"
        "    time__convert_time(source_timezone: str, time: str, target_timezone: str) -> dict\n"
        "    Convert time between timezones\n"
    ) in out
    assert "odd__get_weather_now(city: str, *, from_: str = None" in out
    assert "orders__load_orders() -> list[dict]" in out
    assert "hidden-value" not in out + done.stderr


def test_tools_json_and_the_side_effect_mark(tmp_path: Path, lab_data: Path) -> None:
    path = write_config(tmp_path, {"lab": stdio(LAB, "--data", str(lab_data), sideEffects=["record"])})
    done = sandfleet("tools", "--mcp-config", str(path), "--json")
    assert done.returncode == 0, done.stderr
    listing = json.loads(done.stdout)
    by_name = {t["name"]: t for t in listing["tools"]}
    assert by_name["lab__record"] == {
        "source": "mcp:lab",
        "name": "lab__record",
        "signature": "lab__record(text: str) -> int",
        "description": "Append a line to the lab's notes (a side effect); the number of lines noted so far.",
        "side_effects": True,
    }
    assert not by_name["lab__stats"]["side_effects"]
    [server] = listing["servers"]
    assert server["name"] == "lab" and server["up"] and server["tools"] == len(listing["tools"])


def test_tools_reports_a_server_that_is_down_with_the_fix(tmp_path: Path) -> None:
    path = write_config(tmp_path, {"gone": {"command": "/no/such/server"}, "odd": stdio(ODD)})
    done = sandfleet("tools", "--mcp-config", str(path))
    assert done.returncode == 1
    assert "odd__book" in done.stdout
    assert "mcp:gone is down: cannot start '/no/such/server'" in done.stderr and "fix: install" in done.stderr


def test_doctor_shows_each_server_reachable_or_not(tmp_path: Path) -> None:
    path = write_config(
        tmp_path,
        {"time": third_party("mcp-server-time"), "closed": {"url": "http://127.0.0.1:9/mcp"}},
    )
    done = sandfleet(
        "doctor", "--mcp-config", str(path), "--json", SANDFLEET_REDIS_URL="redis://127.0.0.1:1/0"
    )
    rows = {row["check"]: row for row in json.loads(done.stdout)}
    time, closed = rows["MCP server time"], rows["MCP server closed"]
    assert time["ok"] and "2 tools" in time["detail"] and time["detail"].startswith("stdio: ")
    assert not closed["ok"] and not closed["required"]
    assert "cannot connect to http://127.0.0.1:9/mcp" in closed["detail"]
    assert (
        closed["fix"] == "start the server at http://127.0.0.1:9/mcp, or correct its url in mcpServers.closed"
    )
    # The table shows the same rows; only the closed server's is looked at, so the time server (a
    # process importing the MCP SDK, ~0.6 s of CPU) is not started a second time for it.
    closed_only = write_config(tmp_path, {"closed": {"url": "http://127.0.0.1:9/mcp"}}, name="closed.json")
    table = sandfleet("doctor", "--mcp-config", str(closed_only), SANDFLEET_REDIS_URL="redis://127.0.0.1:1/0")
    assert "MCP server closed" in table.stdout and "fix: start the server at" in table.stdout


def test_doctor_and_worker_refuse_a_malformed_config_naming_line_and_field(tmp_path: Path) -> None:
    path = tmp_path / "mcp.json"
    path.write_text(
        '{\n  "mcpServers": {\n    "time": {\n      "command": "mcp-server-time",\n      "args": "--utc"\n    }\n  }\n}\n'
    )
    expected = f"{path} line 5, mcpServers.time.args: input should be a valid list"
    doctor = sandfleet(
        "doctor", "--mcp-config", str(path), "--json", SANDFLEET_REDIS_URL="redis://127.0.0.1:1/0"
    )
    [row] = [r for r in json.loads(doctor.stdout) if r["check"] == "MCP config"]
    assert doctor.returncode == 1 and expected in row["detail"]
    worker = sandfleet(
        "worker", "--mcp-config", str(path), timeout=60, SANDFLEET_REDIS_URL="redis://127.0.0.1:1/0"
    )
    assert worker.returncode != 0
    assert f"refusing to start: {expected}" in worker.stderr
    from_env = sandfleet(
        "worker", timeout=60, SANDFLEET_MCP_CONFIG=str(path), SANDFLEET_REDIS_URL="redis://127.0.0.1:1/0"
    )
    assert f"refusing to start: {expected}" in from_env.stderr


def test_run_a_program_against_the_mcp_reference_orders(
    docker_engine: object, config: Path, tmp_path: Path
) -> None:
    from sandfleet.worker.tools.examples.scenario import REFERENCE_ANSWER, REFERENCE_PROGRAM

    program = tmp_path / "program.py"
    program.write_text(REFERENCE_PROGRAM.replace("load_orders()", "orders__load_orders()"))
    done = sandfleet("run", str(program), "--mcp-config", str(config))
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == REFERENCE_ANSWER and list(json.loads(done.stdout)) == list(
        REFERENCE_ANSWER
    )


def test_ask_with_an_mcp_config_from_the_settings(
    docker_engine: object, config: Path, tmp_path: Path
) -> None:
    script = tmp_path / "script.json"
    program = (
        "import json\nfrom sandfleet_tools import *\n"
        'r = time__convert_time(source_timezone="Asia/Tokyo", time="12:00", target_timezone="UTC")\n'
        'print("RESULT: " + json.dumps(r["target"]["datetime"][11:16]))\n'
    )
    script.write_text(json.dumps({"rules": [], "default": [f"```python\n{program}```"]}))
    done = sandfleet(
        "ask",
        "Noon in Tokyo is what in UTC?",
        "--model",
        f"replay:{script}",
        SANDFLEET_MCP_CONFIG=str(config),
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout == '"03:00"\n'
