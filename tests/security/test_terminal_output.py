"""Escape sequences aimed at a person's terminal, through a real ``sandfleet worker`` (real Redis, Docker
sandboxes, the replay model over HTTP) and the ``sandfleet`` commands exactly as a person types them.

The attackers: the submitter (the question, a batch file's rows), the model and its program (the
program's text, its RESULT, its tool-call arguments, its files' names, its stderr), an MCP server (tool
descriptions and schemas) and an approver (a denial's reason and name, which other approvers read).
Each plants a screen clear, a window title (OSC 0 ... BEL), an OSC 8 hyperlink, an 8-bit CSI, a
carriage-return overwrite, backspaces, bidi overrides and isolates, zero-width and tag characters.

The mechanism: every command prints through sandfleet/core/console.py (escape_line / escape_text /
escape_json of sandfleet/core/terminal_text.py). Asserted on the raw bytes of stdout and stderr: none
of those characters arrives; they show as ``\\x1b``, ``\\u202e``...; ``--json`` outputs parse back to
the exact original strings; files written with ``--out`` keep their exact names and bytes.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
import redis
from approvals.helpers import wait_for
from sandfleet_testing.workers import (
    JOB_TIMEOUT_S,
    SANDFLEET,
    FleetWorker,
    WorkerFactory,
    fleet_settings_for,
    keys_under,
)

from sandfleet.core.approvals import ApprovalStatus
from sandfleet.core.contracts import JobStatus
from sandfleet.core.key_registry import KeyRegistry
from sandfleet.core.redis_keys import FleetKeys
from sandfleet.core.settings import Settings
from sandfleet.core.signing import WorkerKey

from .helpers import record
from .hostile_mcp_server import DESCRIPTION

# The docker and redis markers come from the fixtures each test uses (tests/conftest.py): the MCP and
# Redis-writer cases below need no engine.

HERE = Path(__file__).resolve().parent
GATED_TOOLS = str(HERE.parent / "approvals" / "gated_tools.py")  # lookup_order; issue_refund, gated
HOSTILE_SERVER = HERE / "hostile_mcp_server.py"
ESC, BEL, CR = "\x1b", "\x07", "\r"
HOSTILE = (
    f"{ESC}[2J{ESC}[H"  # clear the screen, cursor home
    f"{ESC}]0;all approved{BEL}"  # the window's title
    f"{ESC}]8;;https://pay.invalid/{ESC}\\invoice.pdf{ESC}]8;;{ESC}\\"  # a link whose text lies
    "\x9b31m"  # 8-bit CSI: red
    f"{CR}APPROVED by finance   "  # overwrite the line so far
    "deny\b\b\b\b\x7f"  # backspaces, DEL
    "\u202edecnalab\u202c \u2066iso\u2069 zero\u200bwidth\ufeff \U000e0041tag"
)
# The raw bytes none of the commands may print, by what they are.
FORBIDDEN = {
    "ESC": b"\x1b",
    "BEL": b"\x07",
    "BS": b"\x08",
    "CR": b"\r",
    "DEL": b"\x7f",
    "C1 CSI": "\x9b".encode(),
    "RLO": "\u202e".encode(),
    "PDF": "\u202c".encode(),
    "RLI": "\u2066".encode(),
    "ZWSP": "\u200b".encode(),
    "BOM": "\ufeff".encode(),
    "TAG": "\U000e0041".encode(),
}
# Names the worker collects (no C0 control: those are skipped by name, and the skipped name is shown).
ARTIFACT_NAMES = ["\x9b2J-report.txt", "\u202etxt.exe", "plain.csv"]
SKIPPED_NAME = f"{ESC}[2J-skipped.txt"
PAYLOAD = {"echo": HOSTILE, HOSTILE: [HOSTILE, "Zürich 東京"]}
TEXT_RESULT = HOSTILE + " Zürich"
DENY_REASON = f"{ESC}[2Jduplicate{CR}APPROVED"
DENIED_BY = f"bo\u202e{ESC}]0;x{BEL}"
CR_HIDDEN_CALL = 'lookup_order("ran-after-a-carriage-return")'


def fenced(body: str) -> str:
    return f"```python\n{body}```"


RESULT_PROGRAM = f"""import json
from sandfleet_tools import *
# the model's own text: {HOSTILE.replace(CR, "")}
info = lookup_order({HOSTILE!r})
for name in {[*ARTIFACT_NAMES, SKIPPED_NAME]!r}:
    open("/workspace/out/" + name, "w").write("exact bytes of " + name)
print("RESULT: " + json.dumps({{"echo": info["order_id"], {HOSTILE!r}: [{HOSTILE!r}, "Zürich 東京"]}}))
"""
# A lone CR ends a line for Python: the call after it runs. The approver must see it as a line.
REFUND_PROGRAM = f"""import json
from sandfleet_tools import *
from sandfleet_tools import ToolDeniedError
# checked by finance: harmless{CR}{CR_HIDDEN_CALL}
# {HOSTILE.replace(CR, "")}
try:
    ref = issue_refund({HOSTILE!r}, 25.0)
except ToolDeniedError as e:
    ref = "denied: " + str(e)
print("RESULT: " + json.dumps({{"refund": ref}}))
"""
TEXT_PROGRAM = f"print('RESULT: ' + {TEXT_RESULT!r})\n"
FAILING_PROGRAM = f"import sys\nsys.stderr.write({HOSTILE!r} + '\\n')\nraise SystemExit(3)\n"


@dataclass
class HostileFleet:
    worker: FleetWorker
    model: str
    folder: Path

    @property
    def client(self):  # type: ignore[no-untyped-def]
        return self.worker.client


def sandfleet(fleet: HostileFleet | Settings | None, *args: str) -> subprocess.CompletedProcess[bytes]:
    """``sandfleet ARGS`` as a person runs it against the fleet; stdout and stderr as raw bytes."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SANDFLEET_")}
    settings = fleet.worker.settings if isinstance(fleet, HostileFleet) else fleet
    if settings is not None:
        env |= {
            "SANDFLEET_REDIS_URL": settings.redis_url,
            "SANDFLEET_KEY_PREFIX": settings.key_prefix,
            "SANDFLEET_APPROVER_KEY": settings.approver_key,
        }
    return subprocess.run([SANDFLEET, *args], capture_output=True, env=env, timeout=JOB_TIMEOUT_S)


def raw_controls(done: subprocess.CompletedProcess[bytes]) -> list[str]:
    """What of FORBIDDEN reached stdout or stderr raw."""
    output = done.stdout + done.stderr
    return [name for name, raw in FORBIDDEN.items() if raw in output]


def assert_escaped(case: str, done: subprocess.CompletedProcess[bytes], exit_code: int = 0) -> str:
    """The command exited ``exit_code`` and printed none of FORBIDDEN raw; its stdout as text."""
    found = raw_controls(done)
    record(f"terminal: {case}", "runc", not found, found or "escaped")
    assert done.returncode == exit_code, done.stderr.decode(errors="replace")
    assert found == [], f"{case} printed raw {found}"
    return done.stdout.decode()


@pytest.fixture(scope="module")
def fleet(module_fleet_worker: WorkerFactory) -> HostileFleet:
    rules = {
        "(?i)^hostile result": RESULT_PROGRAM,
        "(?i)^hostile refund": REFUND_PROGRAM,
        "(?i)^hostile text": TEXT_PROGRAM,
        "(?i)^hostile failure": FAILING_PROGRAM,
    }
    script = {
        "rules": [{"match": m, "responses": [fenced(p)]} for m, p in rules.items()],
        "default": [fenced('print("RESULT: 0")\n')],
    }
    # The approvers file lists ana and bo; bo signs the denial below (its --by name is the hostile one).
    worker = module_fleet_worker(
        "terminal",
        approvers=("bo", "ana"),
        tools=GATED_TOOLS,
        script=script,
        env={
            "SANDFLEET_APPROVAL_TOOLS": "issue_refund",
            "SANDFLEET_APPROVAL_GRACE_S": "1",
            "SANDFLEET_POOL_FOLLOWS_DEMAND": "false",
        },
    )
    return HostileFleet(worker, worker.model, worker.folder)


@pytest.fixture(scope="module")
def result_job(fleet: HostileFleet) -> str:
    """A finished job whose question, program, RESULT, tool arguments and file names are hostile."""
    job = fleet.client.submit(f"hostile result {HOSTILE}", tools=["lookup_order"], model=fleet.model)
    result = job.result(timeout=JOB_TIMEOUT_S)
    assert result.status == JobStatus.SUCCEEDED, result.error
    assert result.result == PAYLOAD
    assert sorted(a.name for a in result.artifacts) == sorted(ARTIFACT_NAMES)
    assert [s.name for s in result.artifacts_skipped] == [SKIPPED_NAME]
    return job.job_id


def test_result_prints_a_hostile_payload_escaped_and_json_keeps_it_exact(
    fleet: HostileFleet, result_job: str
) -> None:
    shown = assert_escaped("result", sandfleet(fleet, "result", result_job))
    assert json.loads(shown) == PAYLOAD  # C1 and bidi characters as JSON \u escapes: still the payload
    assert "\\u001b[2J" in shown and "\\u202e" in shown and "Zürich 東京" in shown
    exact = json.loads(assert_escaped("result --json", sandfleet(fleet, "result", result_job, "--json")))
    assert exact["result"] == PAYLOAD and exact["verified"] is True


def test_a_text_result_and_a_failures_message_are_escaped(fleet: HostileFleet) -> None:
    text_job = fleet.client.submit(f"hostile text {HOSTILE}", model=fleet.model)
    assert text_job.result(timeout=JOB_TIMEOUT_S).result == TEXT_RESULT
    shown = assert_escaped("result (text)", sandfleet(fleet, "result", text_job.job_id))
    assert shown.startswith("\\x1b[2J\\x1b[H\\x1b]0;all approved\\x07") and "\\rAPPROVED by finance" in shown
    assert "\\u202edecnalab\\u202c" in shown and shown.rstrip("\n").endswith(" Zürich")
    exact = sandfleet(fleet, "result", text_job.job_id, "--json")
    assert json.loads(assert_escaped("result --json (text)", exact))["result"] == TEXT_RESULT

    failed = fleet.client.submit(
        f"hostile failure {HOSTILE}", model=fleet.model, code_action={"max_repairs": 0}
    )
    assert failed.result(timeout=JOB_TIMEOUT_S).status == JobStatus.FAILED
    assert_escaped("result (failed job)", sandfleet(fleet, "result", failed.job_id), exit_code=1)
    as_json = sandfleet(fleet, "result", failed.job_id, "--json")
    [attempt] = json.loads(assert_escaped("result --json (failed job)", as_json, 1))["attempts"]
    assert attempt["stderr_tail"] == HOSTILE + "\n"  # the program's own stderr, exactly


def test_jobs_lists_hostile_questions_on_one_line_each(fleet: HostileFleet, result_job: str) -> None:
    shown = assert_escaped("jobs", sandfleet(fleet, "jobs"))
    [line] = [line for line in shown.splitlines() if line.startswith(result_job)]
    assert "hostile result \\x1b[2J\\x1b[H\\x1b]0;all" in line
    rows = [
        json.loads(row)
        for row in assert_escaped("jobs --json", sandfleet(fleet, "jobs", "--json")).splitlines()
    ]
    assert next(r for r in rows if r["job_id"] == result_job)["question"] == f"hostile result {HOSTILE}"


def test_audit_shows_the_program_and_tool_arguments_escaped(fleet: HostileFleet, result_job: str) -> None:
    shown = assert_escaped("audit", sandfleet(fleet, "audit", result_job))
    [call] = [line for line in shown.splitlines() if "  tool_call  " in line]
    assert '{"approval_id": null, "args": ["\\u001b[2J\\u001b[H\\u001b]0;all approved\\u0007' in call
    [program] = [line for line in shown.splitlines() if "  program  " in line]
    assert "# the model's own text: \\u001b[2J" in program and "\\u009b31mAPPROVED" in program
    events = [
        json.loads(line)
        for line in assert_escaped(
            "audit --json", sandfleet(fleet, "audit", result_job, "--json")
        ).splitlines()
    ]
    programs = [e["data"]["program"] for e in events if e["kind"] == "program"]
    assert programs and f"# the model's own text: {HOSTILE.replace(CR, '')}\n" in programs[0]
    calls = [e["data"] for e in events if e["kind"] == "tool_call"]
    assert [c["args"] for c in calls if c["tool"] == "lookup_order"] == [[HOSTILE]]  # the argument, exactly
    assert_escaped("audit --verify", sandfleet(fleet, "audit", result_job, "--verify"))


def test_artifacts_shows_names_escaped_and_writes_them_exactly(
    fleet: HostileFleet, result_job: str, tmp_path: Path
) -> None:
    done = sandfleet(fleet, "artifacts", result_job)
    shown = assert_escaped("artifacts", done)
    names = {line.split("\t")[0] for line in shown.splitlines()}
    assert names == {"\\x9b2J-report.txt", "\\u202etxt.exe", "plain.csv"}
    assert b"skipped: \\x1b[2J-skipped.txt: " in done.stderr
    listing = json.loads(
        assert_escaped("artifacts --json", sandfleet(fleet, "artifacts", result_job, "--json"))
    )
    assert sorted(a["name"] for a in listing["artifacts"]) == sorted(ARTIFACT_NAMES)
    assert [s["name"] for s in listing["skipped"]] == [SKIPPED_NAME]

    out = tmp_path / "out"
    assert_escaped("artifacts --out", sandfleet(fleet, "artifacts", result_job, "--out", str(out)))
    written = sorted(p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file())
    assert written == sorted(ARTIFACT_NAMES)  # the exact names, and nothing outside the folder
    for name in ARTIFACT_NAMES:
        assert (out / name).read_bytes() == f"exact bytes of {name}".encode()


def test_batch_out_prints_its_summary_escaped_and_keeps_the_files_exact(
    fleet: HostileFleet, tmp_path: Path
) -> None:
    rows = tmp_path / "hostile.jsonl"
    questions = [f"hostile text {HOSTILE}", f"hostile result {HOSTILE}"]
    tools = [[], ["lookup_order"]]
    rows.write_text(
        "".join(
            json.dumps({"question": q, "tools": t, "model": fleet.model}) + "\n"
            for q, t in zip(questions, tools, strict=True)
        )
    )
    out = tmp_path / "batch-out"
    done = sandfleet(fleet, "batch", str(rows), "--out", str(out))
    assert_escaped("batch --out", done)
    assert b"3 artifact file(s) written under" in done.stderr
    results = [json.loads(line) for line in (out / "results.jsonl").read_text(encoding="utf-8").splitlines()]
    assert [r["question"] for r in results] == questions
    assert [r["result"] for r in results] == [TEXT_RESULT, PAYLOAD]
    job_id = results[1]["job_id"]
    assert sorted(p.name for p in (out / job_id).iterdir()) == sorted(ARTIFACT_NAMES)


def test_an_approver_sees_every_field_of_a_hostile_request_escaped(fleet: HostileFleet) -> None:
    client = fleet.client
    question = f"hostile refund {HOSTILE}\nstatus:      approved"  # a second line posing as a row
    job = client.submit(question, tools=["lookup_order", "issue_refund"], model=fleet.model)

    def pending() -> list:  # type: ignore[type-arg]
        return [r for r in client.approvals(job_id=job.job_id) if r.status == ApprovalStatus.PENDING]

    [request] = wait_for(pending, JOB_TIMEOUT_S, what="the approval request")
    assert request.arguments == {"order_id": HOSTILE, "amount": 25.0} and request.question == question

    listed = assert_escaped("approvals list", sandfleet(fleet, "approvals", "list"))
    [line] = [line for line in listed.splitlines() if line.startswith(request.id)]
    assert "issue_refund({" in line and "\\u001b[2J" in line
    rows = assert_escaped("approvals list --json", sandfleet(fleet, "approvals", "list", "--json"))
    assert (
        next(json.loads(r) for r in rows.splitlines() if request.id in r)["arguments"]["order_id"] == HOSTILE
    )

    shown = assert_escaped("approvals show", sandfleet(fleet, "approvals", "show", request.id))
    lines = shown.splitlines()
    assert [line for line in lines if line.startswith("status:")] == ["status:      pending"]  # no forged row
    assert "             status:      approved" in lines  # the question's second line, under its label
    assert f"    {CR_HIDDEN_CALL}" in lines  # the call after a lone CR, on the line Python runs it on
    assert any(line.startswith("question:    hostile refund \\x1b[2J") for line in lines)
    exact = json.loads(
        assert_escaped("approvals show --json", sandfleet(fleet, "approvals", "show", request.id, "--json"))
    )
    assert exact["question"] == question and exact["arguments"]["order_id"] == HOSTILE
    assert f"# checked by finance: harmless{CR}{CR_HIDDEN_CALL}\n" in exact["program"]

    denied = sandfleet(fleet, "approvals", "deny", request.id, "--reason", DENY_REASON, "--by", DENIED_BY)
    assert_escaped("approvals deny", denied)
    result = job.result(timeout=JOB_TIMEOUT_S)
    assert result.status == JobStatus.SUCCEEDED, result.error
    decided = assert_escaped("approvals show (decided)", sandfleet(fleet, "approvals", "show", request.id))
    [row] = [line for line in decided.splitlines() if line.startswith("decided:")]
    assert "by bo\\u202e\\x1b]0;x\\x07 at " in row and row.endswith(": \\x1b[2Jduplicate\\rAPPROVED")
    again = json.loads(sandfleet(fleet, "approvals", "show", request.id, "--json").stdout)
    assert again["reason"] == DENY_REASON and again["decided_by"] == DENIED_BY


def test_tools_shows_a_hostile_mcp_servers_descriptions_escaped(tmp_path: Path) -> None:
    """An MCP server names and describes its own tools: ``sandfleet tools`` is read by the operator."""
    config = tmp_path / "mcp.json"
    servers = {"hostile": {"command": sys.executable, "args": [str(HOSTILE_SERVER)]}}
    config.write_text(json.dumps({"mcpServers": servers}))
    shown = assert_escaped("tools (MCP server)", sandfleet(None, "tools", "--mcp-config", str(config)))
    assert "    \\x1b[2J\\x1b]0;pwned\\x07Reads \\x1b]8;;https://pay.invalid/" in shown
    assert "\\x9b31m safely \\u202edaolnwod\\u202c Zürich" in shown
    listing = sandfleet(None, "tools", "--mcp-config", str(config), "--json")
    tools = json.loads(assert_escaped("tools --json (MCP server)", listing))["tools"]
    assert next(t for t in tools if t["name"] == "hostile__innocent")["description"] == DESCRIPTION


def test_keys_list_shows_a_worker_name_planted_in_redis_escaped(redis_server: str) -> None:
    """Whoever can write Redis can register a key under any worker name (the register is where keys
    are found, not why they are trusted): ``keys list`` shows the name escaped, on one line."""
    settings = fleet_settings_for(redis_server)
    planted = WorkerKey.generate(f"worker1{CR}{ESC}[2K{ESC}]0;trusted{BEL}\u202eok\nfake-key  active")
    raw = redis.Redis.from_url(redis_server)
    try:
        KeyRegistry(raw, FleetKeys(settings.key_prefix)).register(planted.info)
        shown = assert_escaped("keys list (Redis writer)", sandfleet(settings, "keys", "list"))
        [line] = shown.splitlines()  # the \n in the name made no second row
        assert line.startswith(planted.key_id) and line.endswith(
            "worker1\\r\\x1b[2K\\x1b]0;trusted\\x07\\u202eok\\nfake-key  active"
        )
        as_json = sandfleet(settings, "keys", "list", "--json")
        assert (
            json.loads(assert_escaped("keys list --json (Redis writer)", as_json))["worker"] == planted.worker
        )
    finally:
        raw.delete(*keys_under(raw, settings.key_prefix))
        raw.close()


def test_doctor_shows_a_workers_mcp_report_planted_in_redis_escaped_on_one_line_each(
    redis_server: str, docker_engine: object
) -> None:
    """Whoever can write Redis can write a worker's MCP report (``{p}:worker:{name}:mcp``): doctor
    shows each well-formed entry escaped and on one line, and leaves out what is not a status."""
    from sandfleet.worker.mcp.status import ServerStatus, to_report

    settings = fleet_settings_for(redis_server)
    keys = FleetKeys(settings.key_prefix)
    worker = f"w1\n{ESC}[2Kfake"
    planted = ServerStatus(
        name="lab\nMCP server fake on w9  ok  up", where="x", up=False, detail=HOSTILE, fix=f"{ESC}]0;t{BEL}",
        tools=0, restarts=0,
    )  # fmt: skip
    raw = redis.Redis.from_url(redis_server)
    try:
        raw.sadd(keys.workers, worker)
        raw.set(keys.heartbeat(worker), "{}", ex=60)
        raw.hset(
            keys.worker_mcp(worker), mapping={**to_report([planted]), "junk": "[1, 2]", "deep": "[" * 3000}
        )
        shown = assert_escaped("doctor: a worker's MCP report (Redis writer)", sandfleet(settings, "doctor"))
        rows = [line for line in shown.splitlines() if line.startswith("MCP server")]
        assert len(rows) == 1 and rows[0].startswith("MCP server lab MCP server fake on w9  ok  up on w1")
        assert "warning" in rows[0] and "\\x1b[2J" in rows[0]
        as_json = json.loads(
            assert_escaped("doctor --json: a worker's MCP report", sandfleet(settings, "doctor", "--json"))
        )
        [row] = [r for r in as_json if r["check"].startswith("MCP server")]
        assert row["ok"] is False and row["detail"] == "down: " + HOSTILE.replace(CR, " ")
    finally:
        raw.delete(*keys_under(raw, settings.key_prefix))
        raw.close()


def test_an_error_message_quoting_input_is_escaped(tmp_path: Path) -> None:
    """click prints a command's error as ``Error: MESSAGE``, and messages quote what they were given:
    here the field path of a malformed MCP config names a server as the file spells it."""
    config = tmp_path / "mcp.json"
    config.write_text(json.dumps({"mcpServers": {f"srv{ESC}[2J{ESC}]0;title{BEL}\u202e": {"command": 5}}}))
    done = sandfleet(None, "tools", "--mcp-config", str(config))
    assert_escaped("an error message (ClickException)", done, exit_code=1)
    assert b"mcpServers.srv\\x1b[2J\\x1b]0;title\\x07\\u202e.command: " in done.stderr


def test_a_bad_job_id_is_refused_plainly_and_escaped(redis_server: str) -> None:
    settings = fleet_settings_for(redis_server)
    done = sandfleet(settings, "cancel", f"job-{ESC}[2J{BEL}\u202e")
    assert_escaped("cancel of a bad job id", done, exit_code=2)
    assert done.stderr.startswith(b"Error: job id must be 1-128 of letters, digits and _.:-, got 'job-\\x1b")


def test_run_and_sandbox_run_show_a_programs_output_escaped(docker_engine: object, tmp_path: Path) -> None:
    """``sandfleet run`` prints the program's RESULT and stderr, ``sandbox run`` its command's output:
    escaped, lines kept; ``--json`` carries the exact text."""
    program = tmp_path / "hostile.py"
    program.write_text(FAILING_PROGRAM.replace("raise SystemExit(3)", f"print('RESULT: ' + {TEXT_RESULT!r})"))
    shown = assert_escaped("run (RESULT text)", sandfleet(None, "run", str(program)))
    assert shown.startswith("\\x1b[2J\\x1b[H") and shown.endswith(" Zürich\n")
    program.write_text(FAILING_PROGRAM)
    failed = sandfleet(None, "run", str(program))
    assert_escaped("run (program stderr)", failed, exit_code=1)
    assert failed.stderr.startswith(b"\\x1b[2J\\x1b[H\\x1b]0;all approved\\x07")

    command = [
        "sandbox",
        "run",
        "--",
        "python3",
        "-c",
        f"import sys; print({HOSTILE!r}); sys.stderr.write('\\x9b2J')",
    ]
    assert "\\x1b[2J" in assert_escaped("sandbox run", sandfleet(None, *command))
    exact = json.loads(
        assert_escaped("sandbox run --json", sandfleet(None, *command[:2], "--json", *command[2:]))
    )
    assert exact["stdout"] == HOSTILE + "\n" and exact["stderr"] == "\x9b2J"
