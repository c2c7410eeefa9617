"""``sandfleet replay JOB | --batch ID``: re-run finished jobs' final programs with their recorded tool
results, once their records are proven by their audit chains; match or difference, one summary."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from sandfleet.core.console import echo, echo_json, escape_line
from sandfleet.core.errors import SandfleetError

# As sandfleet.worker.rerun.batch.DEFAULT_REPLAY_CONCURRENCY, which is not imported here: the
# sandbox modules load only when a replay runs, not for --help.
DEFAULT_REPLAY_CONCURRENCY = 4


@click.command()
@click.argument("job_id", required=False)
@click.option("--batch", "batch_id", default=None, help="Replay every job of this batch, in this process.")
@click.option(
    "--concurrency",
    type=click.IntRange(1, 64),
    default=DEFAULT_REPLAY_CONCURRENCY,
    show_default=True,
    help="Replays at once (each in its own fresh sandbox; the pool keeps as many warm).",
)
@click.option("--redis-url", default=None, help="Default: SANDFLEET_REDIS_URL.")
@click.option(
    "--keys",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    default=None,
    help="Verify with this key set only (from `sandfleet keys export`).",
)
@click.option(
    "--json", "as_json", is_flag=True, help="JSON: the outcome (a batch: JSONL, then a summary line)."
)
def replay(
    job_id: str | None,
    batch_id: str | None,
    concurrency: int,
    redis_url: str | None,
    keys: Path | None,
    as_json: bool,
) -> None:
    """Re-run JOB's final program (or every job of --batch) in a fresh sandbox, tools answered from its
    audit record, and compare the RESULT with the one the record serves and the chain seals.

    The sandbox has no network, and gets only what this machine's SANDFLEET_POLICY_* settings allow: a
    recorded sandbox beyond them (sudo, a writable root, a runtime, env, limits) is refused, named.

    Shell and chat jobs have no final program: they are verified, not re-run (skipped, with the reason),
    as are jobs that did not succeed.

    Exit 0 when every replayable job matched; 1 on a difference, a record its chain does not prove, a
    replay refused by the local policy, or one that could not run; 3 when some jobs have not ended.
    """
    from sandfleet.core.artifacts import open_artifact_store, with_artifact_digests
    from sandfleet.core.key_registry import KeyRegistry, verification_ring
    from sandfleet.core.queue import redis_errors
    from sandfleet.core.records import RecordReader
    from sandfleet.core.redis_keys import FleetKeys
    from sandfleet.core.settings import get_settings
    from sandfleet.worker.rerun.batch import replay_many, replay_pool, warm_default
    from sandfleet.worker.rerun.job import ReplayState

    if (job_id is None) == (batch_id is None):
        raise click.UsageError("give a JOB or --batch ID")
    settings = get_settings()
    if keys is not None:
        settings = settings.model_copy(update={"trusted_keys": str(keys)})
    url = redis_url or settings.results_redis_url or settings.redis_url
    try:
        # A batch's pool opens first and warms the default replay sandbox while the records are read
        # and verified; one job gets a single cold container (replay_pool).
        with replay_pool(concurrency, warm=batch_id is not None) as pool:
            if batch_id is not None:
                warm_default(pool, settings)
            with RecordReader.connect(url, settings) as reader, redis_errors(url):
                job_ids = reader.batch_job_ids(batch_id) if batch_id else [job_id]
                if not job_ids:
                    raise click.ClickException(f"no batch {batch_id!r} (never submitted, or past retention)")
                store = open_artifact_store(settings, reader.redis)
                evidences = [
                    with_artifact_digests(e, store)
                    for e in reader.evidence_many(job_ids)  # type: ignore[arg-type]
                ]
                ring = verification_ring(settings, KeyRegistry(reader.redis, FleetKeys(settings.key_prefix)))
            if job_id is not None and not evidences[0].record:
                raise click.ClickException(
                    f"no record for job {job_id!r} (never submitted, or past retention)"
                )
            report = replay_many(evidences, ring, pool, settings, min(concurrency, len(evidences)))
    except (SandfleetError, ValueError) as e:  # ValueError: not a job id
        raise click.ClickException(str(e)) from None
    if job_id is not None:
        [outcome] = report.outcomes
        if as_json:
            echo_json(outcome.to_json())
        else:
            echo(outcome.describe())
        sys.exit(report.exit_status())  # as for a batch: a job with nothing to re-run is not a failure
    for outcome in report.outcomes:
        if as_json:
            echo_json(outcome.to_json())
        elif not outcome.matches and outcome.state != ReplayState.SKIPPED:
            echo(f"{escape_line(outcome.job_id)}  {outcome.describe()}")
    summary = report.summary()
    if as_json:
        echo_json({"summary": summary, "seconds": report.seconds})
    else:
        echo(summary)
    sys.exit(report.exit_status())
