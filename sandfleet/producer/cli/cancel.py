"""``sandfleet cancel JOB... | --batch ID``: ask jobs to stop, then wait a little for them to end.

Exit codes: 0 every job asked for ended cancelled or had already ended (nothing to do, said plainly);
1 Redis failed or a job is unknown; 3 a job has not ended within --timeout (its request stays: a
worker ends it when it can, e.g. once one is running).
"""

from __future__ import annotations

import sys
import time

import click

from sandfleet.core.console import echo, echo_json, escape_line
from sandfleet.producer.cli.jobs import EXIT_NOT_DONE, BadInputError, cli_errors

WAIT_POLL_S = 0.05
DEFAULT_WAIT_S = 10.0


@click.command()
@click.argument("job_ids", nargs=-1)
@click.option("--batch", "batch_id", default=None, help="Cancel every job of this batch that has not ended.")
@click.option(
    "--timeout",
    type=float,
    default=DEFAULT_WAIT_S,
    show_default=True,
    help="Seconds to wait for the jobs to end (0: only ask).",
)
@click.option(
    "--json", "as_json", is_flag=True, help="Print JSONL: one {job_id, outcome, was, status} per job."
)
def cancel(job_ids: tuple[str, ...], batch_id: str | None, timeout: float, as_json: bool) -> None:
    """Cancel jobs: a queued job never starts, a running one has its sandbox killed; both end `cancelled`."""
    if bool(job_ids) == bool(batch_id):
        raise BadInputError("name the jobs to cancel, or --batch ID (not both)")
    from sandfleet.core.cancel import CancelOutcome
    from sandfleet.core.errors import JobNotFoundError
    from sandfleet.producer.client import Client

    with cli_errors(), Client() as client:
        ids = client.batch(batch_id).job_ids if batch_id else list(job_ids)
        try:
            reports = client.cancel(ids)
        except ValueError as e:  # not a job id: said plainly, not a traceback
            raise BadInputError(str(e)) from None
        missing = [r.job_id for r in reports if r.outcome == CancelOutcome.MISSING]
        if missing and not batch_id:
            raise JobNotFoundError(
                f"no record for job(s) {', '.join(missing)} (never submitted, or past retention)"
            )
        final = wait_for_ends(client, [r.job_id for r in reports if r.requested], timeout)
    for report in reports:
        status = final.get(report.job_id, report.status if report.outcome == CancelOutcome.ENDED else None)
        if as_json:
            echo_json(
                {
                    "job_id": report.job_id,
                    "outcome": report.outcome.value,
                    "was": report.status,
                    "status": status,
                }
            )
        else:  # ids and states as Redis holds them: one line per job, whatever they contain
            ended = f"; it ended {status}" if report.requested and status else ""
            echo(escape_line(f"{report}{ended}"))
    if batch_id and not as_json:
        counts: dict[str, int] = {}
        for report in reports:
            key = final.get(report.job_id) or (
                report.status if report.outcome == CancelOutcome.ENDED else "pending"
            )
            counts[key] = counts.get(key, 0) + 1
        summary = ", ".join(f"{k} {v}" for k, v in sorted(counts.items()))
        echo(escape_line(f"batch {batch_id}: {len(reports)} jobs ({summary})"), err=True)
    if any(r.requested and r.job_id not in final for r in reports):
        echo(f"some jobs had not ended after {timeout:g} s: their cancel requests stand", err=True)
        sys.exit(EXIT_NOT_DONE)


def wait_for_ends(client: object, job_ids: list[str], timeout: float) -> dict[str, str]:
    """``job id -> final status`` of the jobs that ended within ``timeout`` seconds."""
    from sandfleet.producer.client import Client

    assert isinstance(client, Client)
    deadline = time.monotonic() + max(0.0, timeout)
    ended: dict[str, str] = {}
    waiting = list(job_ids)
    while True:
        records = client.reader.records(waiting) if waiting else []
        for record in records:
            if record.status.is_final:
                ended[record.job_id] = record.status.value
        waiting = [j for j in waiting if j not in ended]
        if not waiting or time.monotonic() >= deadline:
            return ended
        time.sleep(WAIT_POLL_S)
