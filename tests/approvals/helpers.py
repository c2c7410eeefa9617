"""What the approval tests share: programs as the model writes them, the replay script, the ledger,
the worker that gates the test tools, the ``sandfleet`` command of an approver."""

from __future__ import annotations

import json
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sandfleet_testing import wait_for as wait_for
from sandfleet_testing.workers import APPROVERS, SANDFLEET, FleetWorker, WorkerFactory
from sandfleet_testing.workers import JOB_TIMEOUT_S as JOB_TIMEOUT_S  # the approval tests wait this long

from sandfleet.core.approvals import ApprovalStatus

HERE = Path(__file__).resolve().parent
TOOLS = str(HERE / "gated_tools.py")
DECISION_TIMEOUT_S = 60.0
WEBHOOK_SECRET = "s3cret-for-tests"


@dataclass
class Webhook:
    url: str
    posts: list[tuple[dict[str, str], bytes]] = field(default_factory=list)


def approval_env(webhook_url: str = "", **more: str) -> dict[str, str]:
    """The operator policy of the approval tests' workers: ``issue_refund`` gated, grace 1 s,
    ``password`` redacted, no warm containers; ``more`` overrides or adds settings."""
    env = {
        "SANDFLEET_APPROVAL_TOOLS": "issue_refund",
        "SANDFLEET_APPROVAL_GRACE_S": "1",
        "SANDFLEET_APPROVAL_REDACT": "password",
        "SANDFLEET_POOL_FOLLOWS_DEMAND": "false",  # no warm containers: every live one belongs to a run
    }
    if webhook_url:
        env |= {
            "SANDFLEET_APPROVAL_WEBHOOK_URL": webhook_url,
            "SANDFLEET_APPROVAL_WEBHOOK_SECRET": WEBHOOK_SECRET,
        }
    return env | more


def gated_worker(start: WorkerFactory, name: str, env: dict[str, str], **options: Any) -> FleetWorker:
    """A worker (of ``start``, a ``fleet_worker`` fixture) serving the gated test tools with the
    approvals replay script (``FleetWorker.model``), trusting the approvers ana and bo (its approvers
    file, unless ``env`` names another, even ""), its client signing with ana's key."""
    return start(name, tools=TOOLS, script=write_script, approvers=APPROVERS, env=env, **options)


def sandfleet(worker: FleetWorker, *args: str) -> subprocess.CompletedProcess[str]:
    """A ``sandfleet`` command of ``worker``'s fleet, signing as its client does (ana's key)."""
    env = {
        "PATH": "/usr/bin:/bin",
        "SANDFLEET_REDIS_URL": worker.settings.redis_url,
        "SANDFLEET_KEY_PREFIX": worker.settings.key_prefix,
        "SANDFLEET_APPROVER_KEY": worker.settings.approver_key,
    }
    return subprocess.run([SANDFLEET, *args], capture_output=True, text=True, env=env, timeout=120)


def own_containers(worker: FleetWorker) -> list[str]:
    out = subprocess.run(
        ["docker", "ps", "-aq", "--filter", f"label=sandfleet.owner={worker.worker.owner_label}"],
        capture_output=True,
        text=True,
        check=True,
    )
    return out.stdout.split()


def pending_of(worker: FleetWorker, job_id: str) -> list:
    return [r for r in worker.client.approvals(job_id=job_id) if r.status == ApprovalStatus.PENDING]


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


def approval_events(events: list[Any]) -> list[tuple[str, str]]:
    """(event, tool or "") of every approval event, in chain order."""
    return [(e.data["event"], e.data.get("tool", "")) for e in events if e.kind == "approval"]
