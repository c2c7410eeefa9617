"""Helpers of the MCP tests: servers to start, config files to write (fixtures are in conftest.py)."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from sandfleet_testing import wait_until as wait_until

from sandfleet.fleet.local_redis import free_port as free_port  # the one copy; the tests here use it

SERVERS = Path(__file__).with_name("servers")
LAB = SERVERS / "lab.py"
ODD = SERVERS / "odd.py"
CHANGING = SERVERS / "changing.py"
PYTHON = sys.executable
BIN = Path(sys.executable).parent
START_TIMEOUT_S = 30.0


def stdio(script: Path, *args: str, **fields: Any) -> dict[str, Any]:
    """The config entry of a test server over stdio."""
    return {"command": PYTHON, "args": [str(script), *args], **fields}


def third_party(command: str, *args: str, **fields: Any) -> dict[str, Any]:
    """The config entry of a PyPI server installed beside this Python (the dev extra)."""
    return {"command": str(BIN / command), "args": list(args), **fields}


def write_config(folder: Path, servers: dict[str, dict[str, Any]], name: str = "mcp.json") -> Path:
    path = folder / name
    path.write_text(json.dumps({"mcpServers": servers}, indent=2))
    return path


class HttpServer:
    """A test server over streamable HTTP in a subprocess of its own, on a free port."""

    def __init__(self, script: Path, *args: str) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}/mcp"
        self._argv = [PYTHON, str(script), "--http", str(self.port), *args]
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> HttpServer:
        self.process = subprocess.Popen(self._argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            if self.process.poll() is not None:
                err = self.process.stderr.read().decode(errors="replace") if self.process.stderr else ""
                pytest.fail(f"test MCP server {self._argv} exited: {err[-2000:]}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.5):
                    return self
            except OSError:
                if time.monotonic() > deadline:
                    self.stop()
                    pytest.fail(f"test MCP server {self._argv} did not listen within {START_TIMEOUT_S} s")
                time.sleep(0.1)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        if self.process is not None and self.process.stderr is not None:
            self.process.stderr.close()


def git(repo: Path, *args: str) -> str:
    done = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, check=True)
    return done.stdout


def make_repo(folder: Path) -> Path:
    """A git repository with two commits (and, uncommitted, notes.txt for a git_commit test)."""
    folder.mkdir(parents=True)
    git(folder, "init", "-q", "-b", "main")
    git(folder, "config", "user.email", "tests@sandfleet.invalid")
    git(folder, "config", "user.name", "Sandfleet Tests")
    (folder / "README.md").write_text("# demo\n")
    git(folder, "add", "README.md")
    git(folder, "commit", "-q", "-m", "First commit: a README")
    (folder / "orders.py").write_text("ORDERS = []\n")
    git(folder, "add", "orders.py")
    git(folder, "commit", "-q", "-m", "Add the orders module")
    return folder
