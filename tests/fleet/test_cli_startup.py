"""The ``sandfleet`` command loads only what the command run needs (sandfleet/cli.py).

What is asserted is which modules a fresh interpreter has loaded after a command, not how long it
took: the time is benchmarks/cli_startup.py's business, side by side with its references.
"""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
from pathlib import Path

import pytest

from sandfleet.cli import COMMANDS

# Runs the CLI in-process in a fresh interpreter, then prints the top-level packages it loaded.
PROBE = (
    "import sys\n"
    "from sandfleet.cli import main\n"
    "try:\n"
    "    main(sys.argv[1:], prog_name='sandfleet')\n"
    "except SystemExit:\n"
    "    pass\n"
    "sys.stdout.flush()\n"
    "print('\\nLOADED', ' '.join(sorted({m.split('.')[0] for m in sys.modules} | "
    "{m for m in sys.modules if m.startswith('sandfleet.')})))\n"
)
HEAVY = {"pydantic", "pydantic_settings", "redis", "celery", "kombu", "docker", "requests", "openai", "yaml"}


def loaded_by(*args: str, env: dict[str, str] | None = None) -> set[str]:
    done = subprocess.run(
        [sys.executable, "-c", PROBE, *args],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, **(env or {})},
    )
    line = next(line for line in done.stdout.splitlines() if line.startswith("LOADED "))
    return set(line.split()[1:])


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_each_commands_one_line_help_is_the_commands_own(name: str) -> None:
    module, attribute = COMMANDS[name][0].split(":")
    command = getattr(importlib.import_module(module), attribute)
    assert COMMANDS[name][1] == command.get_short_help_str(limit=300)


def test_the_groups_help_imports_no_command() -> None:
    """Only the packages are looked up (to list what is installed); no command module loads."""
    loaded = loaded_by("--help")
    assert not loaded & {target.split(":")[0] for target, _ in COMMANDS.values()}
    assert not loaded & HEAVY, loaded & HEAVY


@pytest.mark.parametrize("command", ["submit", "batch", "result", "audit", "jobs"])
def test_a_producer_commands_help_loads_no_client(command: str) -> None:
    loaded = loaded_by(command, "--help")
    assert "sandfleet.producer.cli.jobs" in loaded
    assert not loaded & HEAVY, loaded & HEAVY


def test_sandbox_run_loads_the_sandbox_and_nothing_of_the_fleet(docker_engine: object) -> None:
    loaded = loaded_by("sandbox", "run", "--", "true")
    thin = "sandfleet.worker.sandbox.docker.engine_api"  # a local engine, spoken to without the SDK
    assert {thin, "pydantic", "sandfleet.worker.sandbox.container"} <= loaded  # it did run
    assert not loaded & {
        "redis",
        "celery",
        "kombu",
        "openai",
        "yaml",
        "pydantic_settings",
        "docker",
        "requests",
    }
    assert "sandfleet.core.contracts" not in loaded  # the words of the records, not their models


def test_run_builds_the_run_models_not_the_job_contracts(docker_engine: object, tmp_path: Path) -> None:
    """A one-program run makes tool-call records and artifact entries only: the ~20 models of the
    queue and the records (sandfleet/core/contracts.py) were ~15 ms of its start-up (issue 25)."""
    program = tmp_path / "prog.py"
    program.write_text('print("RESULT: 1")\n')
    loaded = loaded_by("run", str(program), env={"SANDFLEET_MCP_CONFIG": "", "SANDFLEET_TOOLS": ""})
    assert {"sandfleet.worker.program.runtime", "sandfleet.core.run_models"} <= loaded  # it did run
    assert "pydantic_settings" in loaded  # the settings are still loaded and validated
    assert not loaded & {"sandfleet.core.contracts", "redis", "celery", "kombu", "openai", "docker", "mcp"}
