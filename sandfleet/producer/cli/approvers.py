"""``sandfleet approvers``: the people whose signed decisions workers accept.

    sandfleet approvers keygen [--key FILE]          on the approver's machine: a new key pair
    sandfleet approvers add NAME --key FILE.pub.json  on each worker host: list NAME's public key
    sandfleet approvers list [--json]                 the approvers file's entries
    sandfleet approvers revoke NAME|KEY_ID            decisions signed with it are refused from now on

``keygen`` writes the private key to ``SANDFLEET_APPROVER_KEY`` (or ``--key``; mode 0600, never
overwritten) and its public half beside it (``.pub.json``): only that file leaves the approver's
machine. ``add``, ``list`` and ``revoke`` edit the approvers file (``SANDFLEET_APPROVERS_FILE`` or
``--file``) on the host where they run: it is the operator's file, never Redis
(sandfleet/core/approvers.py says why). Workers read it again whenever it changes.

Exit codes: 0 done, 1 refused (a key that exists already, an unknown approver, an unusable file),
2 bad input.
"""

from __future__ import annotations

import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import NoReturn

import click

from sandfleet.core.approvers import ApproversFile, make_approver_key, public_half_path, read_public_key
from sandfleet.core.console import echo, echo_json, escape_line
from sandfleet.core.errors import ApproverKeyError
from sandfleet.core.settings import get_settings

EXIT_REFUSED = 1


def _when(ts: float | None) -> str:
    return "-" if ts is None else datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%d %H:%M:%S")


def _file(path: str | None) -> ApproversFile:
    path = path or get_settings().approvers_file
    if not path:
        raise click.UsageError("name the approvers file: --file FILE, or set SANDFLEET_APPROVERS_FILE")
    return ApproversFile(path)


def _refused(e: ApproverKeyError) -> NoReturn:
    echo(f"refused: {e}", err=True)
    sys.exit(EXIT_REFUSED)


FILE_OPTION = click.option(
    "--file",
    "approvers_file",
    type=click.Path(dir_okay=False),
    default=None,
    help="The approvers file (default: SANDFLEET_APPROVERS_FILE).",
)


@click.group()
def approvers() -> None:
    """People whose signed decisions workers accept: keygen, add, list, revoke."""


@approvers.command("keygen")
@click.option(
    "--key",
    "key_file",
    type=click.Path(dir_okay=False),
    default=None,
    help="Where the private key goes (default: SANDFLEET_APPROVER_KEY, ~/.sandfleet/approver/key.pem).",
)
def keygen(key_file: str | None) -> None:
    """Make your approver key pair (on your machine): the private key (mode 0600) and its public half.

    Give the public half (FILE.pub.json) to the operator, who runs `sandfleet approvers add NAME --key
    FILE.pub.json` on each worker host. The private key never leaves this machine.
    """
    path = Path(key_file or get_settings().approver_key).expanduser()
    try:
        key = make_approver_key(path)
    except ApproverKeyError as e:
        _refused(e)
    echo(f"key id      {key.key_id}")
    echo(f"private key {escape_line(str(path))} (mode 0600: keep it here)")
    echo(f"public key  {escape_line(str(public_half_path(path)))} (give this to the operator)")


@approvers.command("add")
@click.argument("name")
@click.option(
    "--key",
    "public_file",
    required=True,
    type=click.Path(dir_okay=False, exists=True),
    help="The approver's public key: the .pub.json of keygen, or a PEM public key.",
)
@FILE_OPTION
def add(name: str, public_file: str, approvers_file: str | None) -> None:
    """List NAME's public key in the approvers file (made if missing): workers accept its decisions."""
    if not name.strip() or len(name) > 200 or escape_line(name) != name:
        raise click.UsageError("NAME must be 1-200 printable characters on one line")
    listed = _file(approvers_file)
    try:
        key_id, public = read_public_key(public_file)
        entry = listed.add(name, key_id, public)
    except ApproverKeyError as e:
        _refused(e)
    echo(f"{entry.key_id}  active   {escape_line(entry.name)}  (in {escape_line(str(listed.path))})")


@approvers.command("list")
@FILE_OPTION
@click.option("--json", "as_json", is_flag=True, help="JSONL: one entry per line.")
def list_approvers(approvers_file: str | None, as_json: bool) -> None:
    """Every entry of the approvers file, revoked ones too, in the file's order."""
    try:
        entries = _file(approvers_file).entries()
    except ApproverKeyError as e:
        _refused(e)
    for entry in entries:
        if as_json:
            echo_json(entry.model_dump(mode="json"))
        else:
            echo(f"{entry.key_id}  {entry.status:<8} {_when(entry.added_at)}  {escape_line(entry.name)}")
    if not entries and not as_json:
        echo("no approvers listed", err=True)


@approvers.command("revoke")
@click.argument("who")
@FILE_OPTION
def revoke(who: str, approvers_file: str | None) -> None:
    """Revoke WHO (a name: every active key of it; or a key id): decisions it signed are refused, kept
    so as revoked."""
    try:
        revoked = _file(approvers_file).revoke(who)
    except ApproverKeyError as e:
        _refused(e)
    for entry in revoked:
        echo(f"{entry.key_id}  revoked  {escape_line(entry.name)}")
