"""What the approval tests share: programs as the model writes them, the replay script, the ledger."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

HERE = Path(__file__).resolve().parent
TOOLS = str(HERE / "gated_tools.py")
DECISION_TIMEOUT_S = 60.0


def program(body: str) -> str:
    return "import json\nfrom sandfleet_tools import *\nfrom sandfleet_tools import ToolDeniedError\n" + body


REFUND = program(
    'info = lookup_order("O-1")\n'
    'ref = issue_refund("O-1", 25.0)\n'
    'print("RESULT:", json.dumps({"refund": ref, "paid": info["paid"]}))\n'
)
REFUND_CATCHING = program(
    "try:\n"
    '    ref = issue_refund("O-2", 10.0)\n'
    "except ToolDeniedError as e:\n"
    '    print("RESULT:", json.dumps({"denied": str(e), "type": type(e).__name__,'
    ' "permission": isinstance(e, PermissionError)}))\n'
    "else:\n"
    '    print("RESULT:", json.dumps({"refund": ref}))\n'
)
# The secret is computed (as if read from a vault), so it is in the arguments, not in the program's text:
# redaction hides argument fields; the program is shown to the approver exactly as written.
CRM = program(
    'secret = "hunter" + str(1 + 1)\n'
    'token = connect_crm(user="ana", password=secret)\nprint("RESULT:", json.dumps({"token": token}))\n'
)
# The same login with the password passed by position: its parameter's name still hides it.
CRM_POSITIONAL = program(
    'token = connect_crm("ana", "hunter" + str(1 + 1))\nprint("RESULT:", json.dumps({"token": token}))\n'
)
# A chat job's model asks for the same login as a function call (its arguments are the model's JSON).
CHAT_LOGIN = {
    "rules": [
        {
            "match": "(?i)chat: log in",
            "responses": [
                {
                    "tool_calls": [
                        {"name": "connect_crm", "arguments": {"user": "ana", "password": "hunter2"}}
                    ]
                },
                'Logged in.\nRESULT: "ok"',
            ],
        }
    ]
}
# The gated call waits (in a thread) while the program runs past its exec_timeout.
LATE = program(
    "import threading, time\n"
    'threading.Thread(target=issue_refund, args=("O-9", 99.0), daemon=True).start()\n'
    "time.sleep(30)\n"
)
PLAIN = program('print("RESULT:", json.dumps(lookup_order("O-5")))\n')

RULES = {
    "(?i)refund order one": REFUND,
    "(?i)refund order two": REFUND_CATCHING,
    "(?i)log in to the crm": CRM,
    "(?i)log in by position": CRM_POSITIONAL,
    "(?i)refund too late": LATE,
    "(?i)look up order five": PLAIN,
}


def write_script(folder: Path) -> Path:
    rules = [{"match": m, "responses": [f"```python\n{p}```"]} for m, p in RULES.items()]
    path = folder / "approvals-replay.json"
    path.write_text(json.dumps({"rules": rules, "default": ["no program here"]}))
    (folder / "chat-login.json").write_text(json.dumps(CHAT_LOGIN))
    return path


def ledger(data_dir: Path) -> list[dict[str, Any]]:
    path = data_dir / "ledger.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def wait_for(predicate: Callable[[], Any], timeout_s: float = DECISION_TIMEOUT_S, what: str = "it") -> Any:
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}")
        time.sleep(0.05)


def approval_events(events: list[Any]) -> list[tuple[str, str]]:
    """(event, tool or "") of every approval event, in chain order."""
    return [(e.data["event"], e.data.get("tool", "")) for e in events if e.kind == "approval"]
