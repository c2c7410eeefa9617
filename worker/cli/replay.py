"""``sandfleet replay JOB``: re-run a job's final program with recorded tool results; match or diff."""

from __future__ import annotations

import json
import sys

import click

from sandfleet.core.errors import SandfleetError


@click.command()
@click.argument("job_id")
@click.option("--redis-url", default=None, help="Default: SANDFLEET_REDIS_URL.")
@click.option("--json", "as_json", is_flag=True)
def replay(job_id: str, redis_url: str | None, as_json: bool) -> None:
    """Re-run JOB's final program in a fresh sandbox, tools answered from its audit record; exit 1 on a difference."""
    from sandfleet.core.queue import redis_errors
    from sandfleet.core.records import RecordReader
    from sandfleet.core.settings import get_settings
    from sandfleet.worker.replay import replay_job
    from sandfleet.worker.sandbox.pool import SandboxPool

    settings = get_settings()
    url = redis_url or settings.redis_url
    try:
        with RecordReader.connect(url, settings) as reader, redis_errors(url):
            record = reader.record(job_id)
            if record.result is None or record.spec is None:
                raise click.ClickException(f"job {job_id} has not finished ({record.status.value})")
            events = reader.audit(job_id)
        with SandboxPool(pool_size=0, max_live=1) as pool:
            outcome = replay_job(record.spec, record.result, events, pool)
    except (SandfleetError, ValueError) as e:  # ValueError: not a job id
        raise click.ClickException(str(e)) from None
    if as_json:
        click.echo(
            json.dumps(
                {
                    "job_id": job_id,
                    "match": outcome.matches,
                    "recorded": outcome.recorded,
                    "replayed": outcome.replayed,
                }
            )
        )
    else:
        click.echo(outcome.describe())
    sys.exit(0 if outcome.matches else 1)
