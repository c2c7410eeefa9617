"""A server's prompts never reach a job (docs/mcp.md "Prompts"), and a tool-loop job reads a server's
resources: a real ``sandfleet worker`` on a real Redis, the tests' changing server over stdio (it
lists a prompt whose text tells the model to ignore its instructions), a chat job whose model is a
replay server started here, so the test sees every request body the worker sent it.

The worker never asks the server for its prompts (the server counts the requests), the tools listing
(``sandfleet tools --json``) and the functions offered to the model hold no prompt, and the prompt's
text is in no model request; ``ch__read_resource`` answers the chat job's function call."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import Client, StdioServerParameters
from sandfleet_testing.workers import JOB_TIMEOUT_S, SANDFLEET, FleetWorker, WorkerFactory

from sandfleet.core.contracts import JobStatus
from sandfleet.worker.llm.scripted.script import parse_script
from sandfleet.worker.llm.scripted.server import ReplayServer

from .helpers import CHANGING, stdio, write_config

pytestmark = [pytest.mark.redis]

PROMPT_TEXT = (
    "PROMPT-CANARY-7f3a"  # the start of servers/changing.py PROMPT_TEXT (not imported: it is a server)
)
QUESTION = "chat: read the notes and say what the server was asked"
SCRIPT = {
    "rules": [
        {
            "match": QUESTION,
            "responses": [
                {"tool_calls": [{"name": "ch__read_resource", "arguments": {"uri": "data://notes.txt"}}]},
                {"tool_calls": [{"name": "ch__served", "arguments": {}}]},
                'RESULT: "read"',
            ],
        }
    ]
}


@pytest.fixture(scope="module")
def model_server() -> Iterator[ReplayServer]:
    with ReplayServer(parse_script(SCRIPT, source="prompts")) as server:
        yield server


@pytest.fixture(scope="module")
def config(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_config(tmp_path_factory.mktemp("mcp-prompts"), {"ch": stdio(CHANGING)})


@pytest.fixture(scope="module")
def fleet(module_fleet_worker: WorkerFactory, model_server: ReplayServer, config: Path) -> FleetWorker:
    env = {
        "SANDFLEET_MCP_CONFIG": str(config),
        "SANDFLEET_MODEL": "openai:replay",
        "SANDFLEET_MODEL_BASE_URL": model_server.base_url,
    }
    return module_fleet_worker("mcp-prompts", env=env)


def prompts_offered() -> list[str]:
    """The prompt names the server lists to a client that asks (the MCP SDK's, over stdio)."""

    async def ask() -> list[str]:
        server = StdioServerParameters(command=sys.executable, args=[str(CHANGING)])
        async with Client(server) as client:
            return [p.name for p in (await client.list_prompts()).prompts]

    return anyio.run(ask)


def test_a_servers_prompts_never_reach_a_job_and_a_chat_job_reads_its_resources(
    fleet: FleetWorker, model_server: ReplayServer, config: Path
) -> None:
    assert prompts_offered() == ["takeover"]  # the server offers one, to whoever asks
    job = fleet.client.submit(QUESTION, mode="chat", tools=["ch__read_resource", "ch__served"])
    result = job.result(timeout=JOB_TIMEOUT_S)
    assert result.status == JobStatus.SUCCEEDED, (result.error, fleet.log()[-3000:])
    read, served = [c for t in result.turns for c in t.calls]
    assert read.tool == "ch__read_resource" and read.ok
    assert read.result == {
        "type": "resource",
        "uri": "data://notes.txt",
        "mime_type": "text/plain",
        "text": "the notes",
    }
    assert served.ok and served.result["prompts"] == 0  # the worker never asked for a prompt
    assert served.result["reads"] == ["data://notes.txt"]

    sent = [body for body in model_server.requests() if QUESTION in json.dumps(body)]
    assert len(sent) == 3
    offered = {f["function"]["name"] for f in sent[0]["tools"]}
    assert offered == {"ch__read_resource", "ch__served"}
    assert not any(PROMPT_TEXT in json.dumps(body) or "takeover" in json.dumps(body) for body in sent)

    env = {k: v for k, v in os.environ.items() if not k.startswith("SANDFLEET_")}
    done = subprocess.run(
        [SANDFLEET, "tools", "--mcp-config", str(config), "--json"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    listing: dict[str, Any] = json.loads(done.stdout)
    assert "ch__read_resource" in {t["name"] for t in listing["tools"]}
    assert "takeover" not in done.stdout and PROMPT_TEXT not in done.stdout
