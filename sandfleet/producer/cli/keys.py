"""``sandfleet keys``: the workers' public signing keys.

    sandfleet keys list                    every registered key: id, worker, status
    sandfleet keys export [--out FILE]     the key set an auditor pins (SANDFLEET_TRUSTED_KEYS, --keys)
    sandfleet keys rotate WORKER [--revoke]   on the worker's host: a new key pair for WORKER
    sandfleet keys revoke KEY_ID           entries signed with it are refused from now on

Public keys only leave a worker host. ``rotate`` reads and writes the private key file under
``SANDFLEET_WORKER_STATE_DIR``, so it runs where the worker runs.

A key id is the hash of its public key, recomputed here: a register entry whose id is not (someone who
can write Redis put another public key under a genuine id) is listed as ``INVALID`` with exit 4, and
``export`` refuses to write a key set while the register holds one (exit 4, nothing written).
"""

from __future__ import annotations

import json
import sys
from datetime import UTC, datetime
from pathlib import Path

import click

from sandfleet.core.console import echo, echo_json, echo_json_text, escape_line
from sandfleet.core.key_registry import KeyRegistry, rotate_key
from sandfleet.core.redis_keys import FleetKeys
from sandfleet.core.settings import get_settings
from sandfleet.core.signing import KeyRing, KeyStatus
from sandfleet.producer.cli.jobs import EXIT_UNVERIFIED, cli_errors
from sandfleet.producer.client import Client


def _when(ts: float | None) -> str:
    return "-" if ts is None else datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%d %H:%M:%S")


@click.group()
def keys() -> None:
    """Workers' public signing keys: list, export, rotate, revoke."""


@keys.command("list")
@click.option("--json", "as_json", is_flag=True, help="JSONL: one key per line.")
def list_keys(as_json: bool) -> None:
    """Every key registered in Redis, oldest first."""
    with cli_errors(), Client() as client, client.redis_errors():
        contents = client.registry.contents()
    for info in contents.keys:
        if as_json:
            echo_json_text(info.model_dump_json())
        else:  # ids and worker names as Redis holds them (a Redis writer chooses them)
            echo(
                f"{escape_line(info.key_id)}  {info.status.value:<8} {_when(info.created_at)}  {escape_line(info.worker)}"
            )
    for name, problem in contents.rejected.items():
        if as_json:
            echo_json({"key_id": name, "status": "invalid", "problem": problem})
        else:
            echo(f"{escape_line(name)}  INVALID  (not used: see below)")
    _refuse_if_rejected(contents.rejected, "listed as INVALID")


def _refuse_if_rejected(rejected: dict[str, str], what: str) -> None:
    """Say on stderr why each rejected register entry is not used, and exit 4 if there is any."""
    if not rejected:
        return
    for problem in rejected.values():
        echo(f"refused: {escape_line(problem)}", err=True)
    echo(
        f"{len(rejected)} entr{'y' if len(rejected) == 1 else 'ies'} of the key register {what}: "
        "signatures under those key ids do not verify. Check who can write Redis; remove the entries "
        "(HDEL of the register's field) once the real keys are known",
        err=True,
    )
    sys.exit(EXIT_UNVERIFIED)


@keys.command("export")
@click.option(
    "--out",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Write here (default: stdout).",
)
def export_keys(out: Path | None) -> None:
    """Write every registered public key (with its status) as a key set for auditors to pin."""
    settings = get_settings()
    with cli_errors(), Client(settings=settings) as client, client.redis_errors():
        contents = client.registry.contents()
    _refuse_if_rejected(contents.rejected, "refused, so no key set was written (a pinned set must be whole)")
    infos = contents.keys
    text = json.dumps(KeyRing(infos, "export").export(settings.key_prefix), indent=2) + "\n"
    if out is None:
        echo_json_text(text.removesuffix("\n"))
    else:
        out.write_text(text)
        echo(f"{len(infos)} keys written to {out}", err=True)


@keys.command("rotate")
@click.argument("worker")
@click.option("--revoke", is_flag=True, help="Revoke the old key (it was exposed) instead of retiring it.")
def rotate(worker: str, revoke: bool) -> None:
    """Give WORKER a new key pair (run on its host). A running worker signs with it from its next event.

    The old key is retired (what it signed still verifies) or, with --revoke, revoked (what it signed
    is refused). Export the key set again for auditors who pin it.
    """
    settings = get_settings()
    with cli_errors(), Client(settings=settings) as client, client.redis_errors():
        old, new = rotate_key(
            settings, worker, KeyRegistry(client.redis, FleetKeys(settings.key_prefix)), revoke=revoke
        )
    if old is not None:
        echo(f"{escape_line(old.key_id)}  {old.status.value}")
    echo(f"{escape_line(new.key_id)}  {new.status.value} (worker {escape_line(worker)})")


@keys.command("revoke")
@click.argument("key_id")
def revoke(key_id: str) -> None:
    """Revoke KEY_ID: every entry it signed is refused, and its worker will not start with it."""
    with cli_errors(), Client() as client, client.redis_errors():
        info = client.registry.set_status(key_id, KeyStatus.REVOKED)
    echo(f"{escape_line(info.key_id)}  {info.status.value} (worker {escape_line(info.worker)})")
