"""Only the model client imports ``openai``; the replay server runs on the standard library."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
OPENAI_IMPORT = re.compile(r"^\s*(import openai|from openai[\s.])", re.MULTILINE)
THE_CLIENT = ROOT / "sandfleet" / "worker" / "llm" / "client.py"


def test_only_the_model_client_imports_openai() -> None:
    importers = [
        path.relative_to(ROOT).as_posix()
        for path in sorted((ROOT / "sandfleet").rglob("*.py"))
        if OPENAI_IMPORT.search(path.read_text(encoding="utf-8"))
    ]
    assert importers == [THE_CLIENT.relative_to(ROOT).as_posix()]


def test_the_replay_server_and_its_command_do_not_load_openai() -> None:
    code = (
        "import sys, sandfleet.worker.llm.scripted.server, sandfleet.worker.llm.scripted.registry, sandfleet.worker.cli.model_server; "
        "sys.exit('openai' in sys.modules)"
    )
    assert subprocess.run([sys.executable, "-c", code], cwd=ROOT, timeout=60).returncode == 0
