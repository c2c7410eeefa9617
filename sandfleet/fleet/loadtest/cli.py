"""``sandfleet loadtest``: many concurrent jobs through the fleet; throughput and latency by phase."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import click

from sandfleet.core.console import echo, echo_json
from sandfleet.core.options import parse_options, sandbox_option


@click.command()
@click.option("--jobs", "-n", type=click.IntRange(1, 1_000_000), default=100, show_default=True)
@click.option(
    "--rate", type=click.FloatRange(min=0, min_open=True), default=None, help="Jobs submitted per second."
)
@click.option("--burst", is_flag=True, help="Submit every job at once, one after the other (the default).")
@click.option("--batch", is_flag=True, help="Submit all jobs as one batch (one transaction).")
@click.option(
    "--model-latency",
    type=click.FloatRange(min=0),
    default=0.0,
    show_default=True,
    help="Seconds the replay model takes per answer.",
)
@click.option(
    "--program",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    default=None,
    help="The program the replay model answers with (default: the reference scenario's).",
)
@click.option(
    "--tools",
    "tools_module",
    default=None,
    help="Tool module the jobs may use (default: the example orders tools).",
)
@click.option(
    "--model",
    default=None,
    help="Use this model instead of the replay script (e.g. a fleet-wide replay server).",
)
@sandbox_option
@click.option(
    "--out",
    type=click.Path(file_okay=False, path_type=Path),
    default=Path("loadtest-report"),
    show_default=True,
)
@click.option("--local", is_flag=True, help="Start a fleet here: its own redis-server and worker processes.")
@click.option(
    "--workers",
    type=click.IntRange(1, 64),
    default=1,
    show_default=True,
    help="With --local: worker processes.",
)
@click.option(
    "--concurrency",
    type=click.IntRange(1, 10_000),
    default=16,
    show_default=True,
    help="With --local: jobs in flight per worker.",
)
@click.option(
    "--sandboxes",
    type=click.IntRange(1, 1000),
    default=4,
    show_default=True,
    help="With --local: sandbox slots per worker.",
)
@click.option(
    "--warmup",
    type=click.IntRange(0, 10_000),
    default=None,
    help="Unmeasured jobs first (default: one per local worker, none otherwise).",
)
@click.option(
    "--timeout",
    type=click.FloatRange(min=0),
    default=0.0,
    help="Seconds to wait for the jobs (default: 120 + 2 per job).",
)
@click.option(
    "--metrics",
    "metrics",
    is_flag=True,
    help="With --local: the workers serve Prometheus metrics; print a summary scraped from them.",
)
@click.option(
    "--metrics-url",
    "metrics_urls",
    multiple=True,
    metavar="URL",
    help="A running worker's /metrics endpoint to scrape after the run (repeatable).",
)
@click.option(
    "--hosts",
    type=int,
    default=None,
    help="With --local: a multi-host fleet of N hosts (network namespaces, a Docker engine and a worker each; root).",
)
@click.option(
    "--kill-host",
    type=int,
    default=None,
    metavar="K",
    help="With --hosts: SIGKILL host K's engine and worker mid-batch, bring it back 10 s later.",
)
@click.option(
    "--secure-redis",
    is_flag=True,
    help="With --hosts: the fleet's Redis speaks TLS only (a CA of the run's own) and knows only "
    "deploy/redis-acl.conf's users; workers connect as worker, this command as producer.",
)
@click.option(
    "--sentinel",
    is_flag=True,
    help="With --hosts: the fleet's Redis is a primary, a replica and three Sentinels (quorum 2); "
    "workers and this command use its sentinel:// URL.",
)
@click.option(
    "--kill-redis-primary",
    is_flag=True,
    help="With --sentinel: SIGKILL the Redis primary once a quarter of the jobs ended; the report's "
    "recovery_s is the time from the kill until a job begun after it has ended.",
)
@click.option("--redis-url", default=None, help="The fleet's Redis (default: SANDFLEET_REDIS_URL).")
@click.option("--no-plot", is_flag=True, help="Skip report.png.")
@click.option(
    "--json", "as_json", is_flag=True, help="Print report.json's figures (without per-job rows) on stdout."
)
def loadtest(
    jobs: int,
    rate: float | None,
    burst: bool,
    batch: bool,
    model_latency: float,
    program: Path | None,
    tools_module: str | None,
    model: str | None,
    options: tuple[str, ...],
    out: Path,
    local: bool,
    workers: int,
    concurrency: int,
    sandboxes: int,
    warmup: int | None,
    timeout: float,
    metrics: bool,
    metrics_urls: tuple[str, ...],
    hosts: int | None,
    kill_host: int | None,
    secure_redis: bool,
    sentinel: bool,
    kill_redis_primary: bool,
    redis_url: str | None,
    no_plot: bool,
    as_json: bool,
) -> None:
    """Drive the fleet with many jobs and report throughput and latency by phase.

    Against a running fleet (SANDFLEET_REDIS_URL or --redis-url), or with --local one started here
    and stopped afterwards. Each job runs the given program through the replay model. Progress goes
    to stderr; the summary to stdout; report.json and report.png into --out.
    """
    from sandfleet.fleet.loadtest.session import DEFAULT_TOOLS_MODULE, LoadTestOptions, run_loadtest

    if sum((rate is not None, burst, batch)) > 1:
        raise click.UsageError("choose one of --rate, --burst and --batch")
    if not local and (workers != 1 or concurrency != 16 or sandboxes != 4 or metrics):
        raise click.UsageError("--workers, --concurrency, --sandboxes and --metrics need --local")
    _check_hosts_options(local, hosts, kill_host, workers)
    _check_redis_options(hosts, secure_redis, sentinel, kill_redis_primary)
    opts = LoadTestOptions(
        jobs=jobs,
        rate=rate,
        batch=batch,
        model_latency_s=model_latency,
        tools_module=DEFAULT_TOOLS_MODULE if tools_module is None else tools_module,
        model=model,
        sandbox=parse_options(options),
        out=out,
        local=local,
        workers=workers,
        concurrency=concurrency,
        sandboxes=sandboxes,
        redis_url=redis_url,
        warmup=warmup,
        timeout_s=timeout,
        plot=not no_plot,
        metrics=metrics,
        metrics_urls=list(metrics_urls),
        hosts=hosts or 0,
        kill_host=kill_host,
        secure_redis=secure_redis,
        sentinel=sentinel,
        kill_redis_primary=kill_redis_primary,
    )
    if program is not None:
        opts.program = program.read_text()
    from sandfleet.core.errors import SandfleetError

    try:
        report = run_loadtest(opts)
    except (SandfleetError, RuntimeError) as e:
        raise click.ClickException(str(e)) from None
    _print_report(report, out, plot=not no_plot, as_json=as_json)
    if not report["finished"]:
        echo("loadtest: not every job ended in time", err=True)
        sys.exit(1)


def _print_report(report: dict[str, Any], out: Path, *, plot: bool, as_json: bool) -> None:
    """The summary (or the JSON of the contract) on stdout, and where the report files went."""
    if as_json:
        echo_json(json_summary(report), indent=1)
        return
    from sandfleet.fleet.loadtest.report import format_summary

    # failure kinds and metrics labels come from the fleet's records and endpoints
    echo(format_summary(report))
    if "metrics" in report:
        from sandfleet.fleet.loadtest.scrape import format_metrics

        echo(format_metrics(report["metrics"]))
    echo(f"report: {out / 'report.json'}" + (f", plot: {out / 'report.png'}" if plot else ""))


def _check_hosts_options(local: bool, hosts: int | None, kill_host: int | None, workers: int) -> None:
    """A bad --hosts/--kill-host is refused before anything starts, naming the fix."""
    if hosts is None and kill_host is None:
        return
    if not local:
        raise click.UsageError("--hosts and --kill-host need --local (the fleet is started here)")
    if hosts is None:
        raise click.UsageError("--kill-host needs --hosts N (N of at least 2)")
    if workers != 1:
        raise click.UsageError("--workers does not apply with --hosts: each host runs one worker")
    from sandfleet.fleet.hosts import check_hosts

    try:
        check_hosts(hosts, kill_host)
    except ValueError as e:
        raise click.UsageError(str(e)) from None


def _check_redis_options(hosts: int | None, secure: bool, sentinel: bool, kill_primary: bool) -> None:
    """A Redis option without the multi-host fleet that would start that Redis, refused naming the fix."""
    if secure and not hosts:
        raise click.UsageError("--secure-redis needs --local --hosts N (the fleet's Redis is started here)")
    if sentinel and not hosts:
        raise click.UsageError("--sentinel needs --local --hosts N (the fleet's Redis is started here)")
    if kill_primary and not sentinel:
        raise click.UsageError("--kill-redis-primary needs --sentinel (a replica must take over)")
    if secure and sentinel:
        raise click.UsageError("--secure-redis and --sentinel cannot be combined yet")


def json_summary(report: dict[str, Any]) -> dict[str, Any]:
    """report.json's figures without per-job rows, plus the contract's names (DESIGN.md): ``jobs``,
    ``succeeded``, ``lost`` (no final record), ``done_twice`` (None unless measured: --hosts),
    ``jobs_per_s``; and ``recovery_s`` (seconds from a Redis primary's kill until a job begun after it ended;
    None without --kill-redis-primary)."""
    out = {k: v for k, v in report.items() if k not in ("jobs", "completions_s")}
    counts = report["counts"]
    out["jobs"] = counts["submitted"]
    out["succeeded"] = counts["succeeded"]
    out.setdefault("lost", counts["unfinished"])
    out.setdefault("done_twice", None)
    out.setdefault("recovery_s", None)
    out["jobs_per_s"] = report.get("throughput_jobs_per_s")
    return out
