"""``sandfleet audit``: a job's audit events; verifying jobs and batches; audit bundles.

    sandfleet audit JOB                     the events, in order
    sandfleet audit JOB --verify            ... and whether record and chain agree (exit 1 if not)
    sandfleet audit --verify --batch ID     every job of a batch, one summary
    sandfleet audit JOB --export FILE       a self-contained bundle (also with --batch ID)
    sandfleet audit --verify-file FILE      check a bundle offline: no Redis needed

Verifying exits 0 when everything checked is proven, 1 when a record and its chain disagree (or the
chain does not hold), 3 when a batch has jobs that have not ended (or have no record).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING

import click

from sandfleet.core.console import echo, echo_json, echo_json_text, escape_line, json_text
from sandfleet.core.errors import SigningKeyError
from sandfleet.producer.cli.jobs import (
    EXIT_JOB_FAILED,
    EXIT_NOT_DONE,
    BadInputError,
    cli_errors,
    client_for,
    format_time,
    keys_option,
)

if TYPE_CHECKING:  # the verifier (pydantic, the contracts) loads when a command runs: `--help` costs click
    from sandfleet.core.verify import BatchVerdict, Verdict

MAX_PROBLEMS_SHOWN = 20


def batch_exit_status(report: BatchVerdict) -> int:
    from sandfleet.core.verify import VerdictState

    if report.count(VerdictState.MISMATCHED):
        return EXIT_JOB_FAILED
    return 0 if report.verified else EXIT_NOT_DONE


def show_report(report: BatchVerdict, as_json: bool) -> None:
    """Each job that is not proven, with why, then the summary; JSON: one object with both."""
    from sandfleet.core.verify import VerdictState

    if as_json:
        data = {
            "summary": {s.value: report.count(s) for s in VerdictState}
            | {"jobs": len(report.verdicts), "events": report.events, "seconds": report.seconds},
            "verdicts": [_verdict_json(v) for v in report.verdicts],
        }
        echo_json(data)
        return
    shown = 0
    for verdict in report.verdicts:
        if not verdict.verified and shown < MAX_PROBLEMS_SHOWN:
            echo(f"{escape_line(verdict.job_id)}  {verdict.describe()}")
            shown += 1
    echo(report.summary())
    if report.verdicts:
        echo(f"keys: {report.verdicts[0].key_source}", err=True)


def _verdict_json(verdict: Verdict) -> dict[str, object]:
    return {**verdict.model_dump(mode="json"), "verified": verdict.verified}


@click.command()
@click.argument("job_id", required=False)
@click.option(
    "--batch", "batch_id", default=None, help="Every job of this batch (with --verify or --export)."
)
@click.option("--json", "as_json", is_flag=True, help="JSONL events; with --verify, the verdict(s) as JSON.")
@click.option("--verify", is_flag=True, help="Check the record against its chain and the signatures.")
@click.option(
    "--export",
    "export_path",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Write a self-contained audit bundle (records, events, public keys) to this file.",
)
@click.option(
    "--verify-file",
    "bundle_path",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    default=None,
    help="Verify an audit bundle offline (no Redis). Pin the fleet's keys with --keys.",
)
@keys_option
def audit(
    job_id: str | None,
    batch_id: str | None,
    as_json: bool,
    verify: bool,
    export_path: Path | None,
    bundle_path: Path | None,
    keys: Path | None,
) -> None:
    """Print a job's audit events in order (model calls, programs, runs, tool calls, states), verify
    jobs and batches, or export and check audit bundles."""
    if bundle_path is not None:
        if job_id or batch_id or export_path:
            raise BadInputError("--verify-file takes no JOB, --batch or --export: the bundle names its jobs")
        verify_bundle(bundle_path, keys, as_json)
        return
    if (job_id is None) == (batch_id is None):
        raise BadInputError("give a JOB or --batch ID (or --verify-file FILE)")
    if batch_id is not None and not (verify or export_path):
        raise BadInputError("--batch needs --verify or --export")
    with cli_errors(), client_for(keys) as client:
        if batch_id is not None:
            handle = client.batch(batch_id)
            report = handle.export(export_path) if export_path else handle.verify()
            if export_path:
                echo(f"bundle of {len(handle)} jobs written to {export_path}", err=True)
            if verify or export_path:
                show_report(report, as_json)
            sys.exit(batch_exit_status(report) if verify else 0)
        job = client.get(job_id)  # type: ignore[arg-type]  # checked above: one of the two is set
        events = job.audit()
        verdict = job.export(export_path) if export_path else (job.verify() if verify else None)
    if export_path:
        echo(f"bundle of job {escape_line(str(job_id))} written to {export_path}", err=True)
    for event in events:
        if as_json:
            echo_json_text(event.model_dump_json())
        else:  # the data of model calls, programs, tool calls: the program's and the model's text
            data = json_text(event.data, default=str)[:300]
            echo(f"{format_time(event.ts)}  #{event.attempt}  {escape_line(event.kind):<12} {data}")
    if verify and verdict is not None:
        show_verdict(verdict, len(events), as_json)


def show_verdict(verdict: Verdict, events: int, as_json: bool) -> None:
    """One job's verdict (on stderr under --json, whose stdout is the events); exit 1 when record and
    chain disagree."""
    if verdict.holds:
        proven = f"; the final record is proven ({verdict.describe()})" if verdict.verified else ""
        echo(f"audit chain holds ({events} events){proven}", err=as_json)
    else:
        where = f" at event {verdict.bad_index}" if verdict.bad_index is not None else ""
        problems = "; ".join(verdict.problems)
        echo(f"audit chain BROKEN{where} of {events}: the record was altered: {problems}", err=True)
    if not verdict.holds:
        sys.exit(EXIT_JOB_FAILED)


def verify_bundle(path: Path, keys: Path | None, as_json: bool) -> None:
    """Check every job of the bundle at ``path`` with no Redis; keys pinned by ``keys`` if given."""
    from sandfleet.core.bundle import read_bundle
    from sandfleet.core.key_registry import trusted_ring
    from sandfleet.core.verify import verify_jobs

    try:
        evidences, bundled = read_bundle(path)
        ring = trusted_ring(keys) if keys is not None else bundled
    except SigningKeyError as e:
        raise BadInputError(str(e)) from None
    report = verify_jobs(evidences, ring)
    show_report(report, as_json)
    if keys is None and not as_json:
        echo(
            "note: checked with the keys inside the bundle; pin the fleet's own (--keys FILE from "
            "`sandfleet keys export`) to know they are the fleet's",
            err=True,
        )
    sys.exit(batch_exit_status(report))
