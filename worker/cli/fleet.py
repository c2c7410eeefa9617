"""``sandfleet worker``: a Celery worker with the fleet's settings."""

from __future__ import annotations

import click

from producer.errors import InvalidSpecError
from producer.settings import get_settings

DEFAULT_CONCURRENCY = 32  # as worker.celery_app.DEFAULT_CONCURRENCY; repeated so --help imports no Celery app


@click.command()
@click.option(
    "-c",
    "--concurrency",
    type=click.IntRange(1, 10_000),
    default=DEFAULT_CONCURRENCY,
    show_default=True,
    help="Jobs in flight (threads). Jobs waiting on the model hold no container, so this can far exceed --sandboxes.",
)
@click.option(
    "-s",
    "--sandboxes",
    type=click.IntRange(1, 1000),
    default=None,
    help="Live sandbox containers at most (default: SANDFLEET_MAX_SANDBOXES).",
)
@click.option(
    "-Q", "--queues", default=None, help="Comma-separated queues to consume (default: the fleet's)."
)
@click.option(
    "-n", "--hostname", default=None, help="Worker name, e.g. worker1@%h (Celery's default if unset)."
)
@click.option(
    "-l",
    "--loglevel",
    type=click.Choice(["debug", "info", "warning", "error"], case_sensitive=False),
    default="info",
    show_default=True,
)
def worker(
    concurrency: int, sandboxes: int | None, queues: str | None, hostname: str | None, loglevel: str
) -> None:
    """Start a worker: takes jobs from Redis, runs them in sandboxes, writes their records.

    Uses the thread pool: --concurrency jobs in flight share --sandboxes containers.
    """
    from producer.queue import queue_name

    settings = get_settings()
    try:  # building the app checks that the time limits nest, and refuses to start if they do not
        from worker.celery_app import CONF_MAX_SANDBOXES, app
    except InvalidSpecError as e:
        raise click.ClickException(f"refusing to start: {e}") from None
    from producer.errors import SandfleetError
    from worker.tools.registry import ToolRegistry

    try:  # a worker that cannot load its tools would fail every job: refuse to start instead
        ToolRegistry.from_modules(settings.tools)
    except SandfleetError as e:
        raise click.ClickException(f"refusing to start: {e}") from None
    app.conf[CONF_MAX_SANDBOXES] = sandboxes or settings.max_sandboxes
    argv = [
        "worker",
        "--pool=threads",
        f"--concurrency={concurrency}",
        f"--queues={queues or queue_name(settings)}",
        f"--loglevel={loglevel.upper()}",
        "--events",
    ]
    if hostname:
        argv.append(f"--hostname={hostname}")
    app.worker_main(argv)
