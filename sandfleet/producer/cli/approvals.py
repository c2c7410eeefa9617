"""``sandfleet approvals list | show ID | approve ID | deny ID --reason TEXT``: deciding gated calls.

``approve`` and ``deny`` sign the decision with the approver's key (``SANDFLEET_APPROVER_KEY`` or
``--key``; ``sandfleet approvers keygen`` makes one): workers act only on decisions signed by a key
their approvers file lists (``--unsigned`` signs nothing, for fleets whose workers allow it).
``show`` first says whether the request read from Redis is the one its worker signed (``verified:``,
sandfleet/producer/request_check.py), and ``approve`` refuses one that is not.

Exit codes: 0 done, 1 the decision was refused (unknown id, decided before, timed out, withdrawn
because its job ended, another call hash, a request that is not the one its worker signed, no usable
approver key) or Redis failed, 2 bad input.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import click

from sandfleet.core.console import echo, echo_json, escape_line, escape_program, escape_text, json_text
from sandfleet.core.errors import ApprovalError, InvalidSpecError, QueueUnavailableError, SigningKeyError

if TYPE_CHECKING:
    from sandfleet.core.approvals import ApprovalRequest
    from sandfleet.producer.request_check import RequestCheck

EXIT_REFUSED = 1
EXIT_BAD_INPUT = 2
PROGRAM_LINES_SHOWN = 40
LABEL_WIDTH = 13


@contextmanager
def approval_errors() -> Iterator[None]:
    try:
        yield
    except (ApprovalError, SigningKeyError) as e:  # SigningKeyError: the approver's key (ApproverKeyError)
        echo(f"refused: {e}", err=True)
        sys.exit(EXIT_REFUSED)
    except InvalidSpecError as e:
        echo(str(e), err=True)
        sys.exit(EXIT_BAD_INPUT)
    except QueueUnavailableError as e:
        raise click.ClickException(str(e)) from None


def _client() -> Any:
    from sandfleet.producer.client import Client

    return Client()


def _when(ts: float | None) -> str:
    from datetime import UTC, datetime

    return "-" if ts is None else datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def _line(request: ApprovalRequest) -> str:
    arguments = json_text(request.arguments)[:60]
    return (
        f"{escape_line(request.id)}  {request.status.value:<9}  {escape_line(request.tool)}({arguments})  "
        f"job {escape_line(request.job_id)}"
    )


def show_request(request: ApprovalRequest, as_json: bool, check: RequestCheck | None = None) -> None:
    """Every field an approver judges, escaped (they come from the program, the submitter, the model
    and Redis): one-line fields show no line break at all; the question, the arguments and the
    program keep their lines, each indented under its label so that none can pose as another row.
    ``check``: the request compared with the worker's signed ``requested`` event, shown first."""
    if as_json:
        data = request.model_dump(mode="json")
        if check is not None:
            data["signed_request"] = {
                "state": check.state,
                "detail": check.detail,
                "differing": check.differing,
            }
        echo_json(data)
        return
    if check is not None:
        echo(f"{'verified:':<{LABEL_WIDTH}}" + escape_line(check.describe()))
    job = escape_line(request.job_id) + (
        f" (batch {escape_line(request.batch_id)})" if request.batch_id else ""
    )
    rows = [
        ("request", escape_line(request.id)),
        ("status", request.status.value),
        ("tool", escape_line(request.tool)),
        ("arguments", json_text(request.arguments, indent=2)),
        ("redacted", ", ".join(escape_line(name) for name in request.redacted) or "-"),
        ("call sha256", escape_line(request.call_sha256)),
        ("job", job),
        ("attempt", str(request.attempt)),
        ("asked", f"{_when(request.asked_at)} by worker {escape_line(request.worker or '?')}"),
        ("deadline", _when(request.deadline)),
        ("question", escape_text(request.question)),
    ]
    if request.decided_by:
        why = f": {escape_line(request.reason)}" if request.reason else ""
        decided = (
            f"{request.status.value} by {escape_line(request.decided_by)} at {_when(request.decided_at)}"
        )
        rows.append(("decided", decided + why))
        rows.append(("signed", _signed_row(request)))
    if request.refused:
        rows.append(("refused", escape_line(request.refused)))
    for name, value in rows:
        echo(f"{name + ':':<{LABEL_WIDTH}}" + value.replace("\n", "\n" + " " * LABEL_WIDTH))
    # The lines Python runs (a lone CR ends a line for it too), each escaped.
    program = escape_program(request.program).removesuffix("\n")
    lines = program.split("\n") if program else []
    echo("program:")
    for line in lines[:PROGRAM_LINES_SHOWN]:
        echo(f"    {line}")
    if len(lines) > PROGRAM_LINES_SHOWN:
        echo(f"    ... {len(lines) - PROGRAM_LINES_SHOWN} more lines (--json shows all)")


def _claimed_key(request: ApprovalRequest) -> str | None:
    """The key id the stored decision names ("?" if unreadable), None when it is unsigned."""
    if not request.decision:
        return None
    try:
        return str(json.loads(request.decision)["decision"]["key_id"])
    except (ValueError, KeyError, TypeError):
        return "?"


def _signed_row(request: ApprovalRequest) -> str:
    """Which key the stored decision claims (checked by the workers, not here: Redis holds it)."""
    key_id = _claimed_key(request)
    if key_id is None:
        return "no (an unsigned decision, or the workers' timeout)"
    if key_id == "?":
        return "unreadable (workers refuse it)"
    return f"by key {escape_line(key_id)} (workers check it against their approvers file)"


def _sign_options(command: Any) -> Any:
    command = click.option(
        "--unsigned",
        is_flag=True,
        help="Sign nothing (workers refuse it unless SANDFLEET_APPROVAL_ALLOW_UNSIGNED is set).",
    )(command)
    return click.option(
        "--key",
        "key_file",
        type=click.Path(dir_okay=False),
        default=None,
        help="The approver's private key (default: SANDFLEET_APPROVER_KEY, ~/.sandfleet/approver/key.pem).",
    )(command)


def _decided_line(verb: str, request: ApprovalRequest, outcome: str) -> str:
    key_id = _claimed_key(request)
    signed = f"signed by key {escape_line(key_id)}" if key_id else "unsigned"
    return (
        f"{verb} {escape_line(request.id)}: {escape_line(request.tool)} of job "
        f"{escape_line(request.job_id)} {outcome} ({signed})"
    )


@click.group()
def approvals() -> None:
    """Approval requests of gated tool calls: list, show, approve, deny."""


@approvals.command("list")
@click.option("--all", "show_all", is_flag=True, help="Every request, decided ones too (default: pending).")
@click.option("--job", "job_id", default=None, help="Only this job's requests.")
@click.option("--limit", type=click.IntRange(1, 10_000), default=100, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="Print JSONL: one request per line.")
def list_requests(show_all: bool, job_id: str | None, limit: int, as_json: bool) -> None:
    """List approval requests, oldest first (pending ones unless --all or --job)."""
    with approval_errors(), _client() as client:
        found = client.approvals(pending_only=not (show_all or job_id), job_id=job_id, limit=limit)
    for request in found:
        if as_json:
            echo_json(request.model_dump(mode="json"))
        else:
            echo(_line(request))
    if not found and not as_json:
        echo("no approval requests" + ("" if show_all or job_id else " waiting"), err=True)


@approvals.command("show")
@click.argument("request_id")
@click.option("--json", "as_json", is_flag=True, help="Print the request as JSON.")
def show(request_id: str, as_json: bool) -> None:
    """Show everything a person needs to judge one request: tool, arguments, program, question, job."""
    with approval_errors(), _client() as client:
        request, check = client.check_approval(request_id)
    show_request(request, as_json, check)


@approvals.command("approve")
@click.argument("request_id")
@click.option(
    "--sha256", "call_sha256", default="", help="Refuse unless the call's hash is this one (from show)."
)
@click.option("--by", default=None, help="Your name in the decision (default: user@host).")
@_sign_options
@click.option("--json", "as_json", is_flag=True, help="Print the decided request as JSON.")
def approve(
    request_id: str, call_sha256: str, by: str | None, key_file: str | None, unsigned: bool, as_json: bool
) -> None:
    """Approve REQUEST_ID, signed with your approver key: its exact call runs once, and its job resumes.

    Refused unless the request in Redis is the one its worker signed (what `show` says on `verified:`).
    """
    with approval_errors(), _client() as client:
        request = client.approve(request_id, by=by, call_sha256=call_sha256, key=key_file, unsigned=unsigned)
    if as_json:
        show_request(request, True)
    else:
        echo(_decided_line("approved", request, "runs once"))


@approvals.command("deny")
@click.argument("request_id")
@click.option("--reason", required=True, help="Why (the program's ToolDeniedError and the audit show it).")
@click.option("--by", default=None, help="Your name in the decision (default: user@host).")
@_sign_options
@click.option("--json", "as_json", is_flag=True, help="Print the decided request as JSON.")
def deny(
    request_id: str, reason: str, by: str | None, key_file: str | None, unsigned: bool, as_json: bool
) -> None:
    """Deny REQUEST_ID, signed with your approver key: the program gets ToolDeniedError with the reason."""
    with approval_errors(), _client() as client:
        request = client.deny(request_id, reason, by=by, key=key_file, unsigned=unsigned)
    if as_json:
        show_request(request, True)
    else:
        echo(_decided_line("denied", request, "will not run"))
