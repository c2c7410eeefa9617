"""``sandfleet worker``: a Celery worker with the fleet's settings."""

from __future__ import annotations

from typing import Any

import click

from sandfleet.core.console import echo
from sandfleet.core.errors import InvalidSpecError
from sandfleet.core.settings import DEFAULT_CONCURRENCY, get_settings
from sandfleet.worker.cli.common import mcp_config_option


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
@mcp_config_option
def worker(
    concurrency: int,
    sandboxes: int | None,
    queues: str | None,
    hostname: str | None,
    loglevel: str,
    mcp_config: str | None,
) -> None:
    """Start a worker: takes jobs from Redis, runs them in sandboxes, writes their records.

    Uses the thread pool: --concurrency jobs in flight share --sandboxes containers. The MCP servers
    of --mcp-config are started with the first job and stopped with the worker.
    """
    import redis
    from celery.utils.nodenames import default_nodename, host_format

    from sandfleet.core.errors import SigningKeyError
    from sandfleet.core.queue import queue_name
    from sandfleet.worker.delivery.celery_app import create_app

    settings = get_settings()
    if mcp_config:
        settings = settings.model_copy(update={"mcp_config": mcp_config})
    try:  # building the app checks that the time limits nest, and refuses to start if they do not
        app = create_app(settings, max_sandboxes=sandboxes)
    except InvalidSpecError as e:
        raise click.ClickException(f"refusing to start: {e}") from None
    from sandfleet.core.errors import SandfleetError
    from sandfleet.worker.tools.registry import ToolRegistry

    try:  # a worker that cannot load its tools would fail every job: refuse to start instead
        ToolRegistry.from_modules(settings.tools)
        if settings.mcp_config:
            from sandfleet.worker.mcp.config import load_mcp_config

            load_mcp_config(settings.mcp_config)  # malformed: refused here, naming the line and field
    except SandfleetError as e:
        raise click.ClickException(f"refusing to start: {e}") from None
    name = host_format(default_nodename(hostname))  # the node name, exactly as Celery makes it
    try:  # every record this worker writes is signed: no usable key, no worker
        app.state.load_signer(name)
    except SigningKeyError as e:
        raise click.ClickException(f"refusing to start: {e}") from None
    except redis.RedisError as e:  # Redis not up yet: the key is registered once the worker connects
        echo(f"warning: cannot register the signing key yet ({e}); retrying when connected", err=True)
    run_worker(app, name, concurrency=concurrency, queues=queues or queue_name(settings), loglevel=loglevel)


def run_worker(app: Any, name: str, *, concurrency: int, queues: str, loglevel: str) -> None:
    """Consume as ``celery worker --pool=threads --events`` would, without Celery's command line.

    ``app.worker_main`` goes through ``celery.bin.celery``, which builds the whole ``celery`` CLI at
    import: click-repl with prompt_toolkit and pygments, and every installed ``celery.commands``
    plugin, Flower with tornado and prometheus_client among them, ~0.3 s of a worker's start-up
    that it never uses (issue 25). The worker itself is the same ``app.Worker`` the CLI starts, as
    ``--without-mingle --without-gossip``: mingle waits ~1 s at every start for other workers to
    share their revoked task ids and logical clocks, and gossip has each worker consume every other
    worker's heartbeat events; Sandfleet uses neither (a cancel is its own Redis record, presence its
    own heartbeat key, sandfleet/worker/delivery/recovery.py). Task events still go out for Flower.
    """
    worker = app.Worker(
        hostname=name,
        pool_cls="threads",
        concurrency=concurrency,
        queues=queues.split(","),
        loglevel=loglevel.upper(),
        task_events=True,
        without_mingle=True,
        without_gossip=True,
    )
    worker.start()
    if worker.exitcode:
        raise SystemExit(worker.exitcode)
