"""One load test from start to end: the fleet (started here with ``local``, or an existing one), the
sampler, the run, the report and the plot. The CLI and the benchmarks call :func:`run_loadtest`."""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from sandfleet.core.replies import text_list, text_or_none
from sandfleet.core.settings import Settings, get_settings
from sandfleet.fleet.loadtest.driver import LoadPlan, run_load
from sandfleet.fleet.loadtest.plot import write_plot
from sandfleet.fleet.loadtest.report import build_report, write_report
from sandfleet.fleet.loadtest.sampler import FleetSampler
from sandfleet.fleet.local import FleetConfig, LocalFleet, replay_model_name, replay_script
from sandfleet.producer.client import Client
from sandfleet.worker.tools.examples.scenario import REFERENCE_PROGRAM, REFERENCE_QUESTION

DEFAULT_TOOLS_MODULE = "sandfleet.worker.tools.examples.orders"


@dataclass
class LoadTestOptions:
    """Everything ``sandfleet loadtest`` accepts. ``timeout_s`` 0 means 120 s + 2 s per job."""

    jobs: int = 100
    rate: float | None = None
    batch: bool = False
    model_latency_s: float = 0.0
    program: str = REFERENCE_PROGRAM
    question: str = REFERENCE_QUESTION
    tools_module: str = DEFAULT_TOOLS_MODULE
    model: str | None = None  # None: a replay script made of ``program``
    sandbox: dict[str, Any] = field(default_factory=dict)
    out: Path = Path("loadtest-report")
    local: bool = False
    workers: int = 1
    concurrency: int = 16
    sandboxes: int = 4
    worker_env: dict[str, str] = field(default_factory=dict)
    redis_url: str | None = None
    warmup: int | None = None  # None: one job per local worker, none against a running fleet
    timeout_s: float = 0.0
    plot: bool = True
    progress: TextIO | None = sys.stderr
    metrics: bool = False  # local workers serve Prometheus metrics; the report gets their summary
    metrics_urls: list[str] = field(default_factory=list)  # running workers' endpoints to scrape
    hosts: int = 0  # with local: a multi-host fleet of this many hosts (sandfleet/fleet/hosts.py)
    kill_host: int | None = None  # with hosts: the host lost mid-batch
    secure_redis: bool = False  # with hosts: Redis over TLS only, an ACL user per role
    sentinel: bool = False  # with hosts: Redis as primary + replica + three Sentinels
    kill_redis_primary: bool = False  # with sentinel: the primary SIGKILLed mid-batch

    def wait_s(self) -> float:
        return self.timeout_s or 120.0 + 2.0 * self.jobs


def tool_names(module: str) -> list[str]:
    """The tools a module offers (what each job is allowed to call)."""
    from sandfleet.worker.tools.registry import ToolRegistry

    return ToolRegistry.from_modules(module).names() if module else []


def run_loadtest(opts: LoadTestOptions) -> dict[str, Any]:
    """Run one load test; writes report.json (and report.png) into ``opts.out``; returns the report."""
    opts.out.mkdir(parents=True, exist_ok=True)
    if opts.local and opts.hosts:
        from sandfleet.fleet.loadtest.hosts_run import run_on_hosts

        config = FleetConfig(
            concurrency=opts.concurrency,
            sandboxes=opts.sandboxes,
            tools=opts.tools_module,
            program=opts.program,
            model_latency_s=opts.model_latency_s,
            env=opts.worker_env,
        )
        report = run_on_hosts(
            opts.hosts,
            config,
            lambda m: make_plan(opts, opts.model or m, warmup=opts.hosts),
            opts.kill_host,
            opts.progress,
            secured=opts.secure_redis,
            sentinel=opts.sentinel,
            kill_redis_primary=opts.kill_redis_primary,
        )
    elif opts.local:
        config = FleetConfig(
            workers=opts.workers,
            concurrency=opts.concurrency,
            sandboxes=opts.sandboxes,
            tools=opts.tools_module,
            program=opts.program,
            model_latency_s=opts.model_latency_s,
            env=opts.worker_env,
            metrics=opts.metrics,
        )
        with LocalFleet(config) as fleet:
            plan = make_plan(opts, opts.model or fleet.model, warmup=opts.workers)
            report = run_on_fleet(fleet, plan, progress=opts.progress)
            urls = [w.metrics_url for w in fleet.workers if w.metrics_url] + opts.metrics_urls
            if urls:
                report["metrics"] = scraped_metrics(urls)
    else:
        settings = get_settings()
        redis_url = opts.redis_url or settings.redis_url
        model = opts.model
        if model is None:  # the fleet's workers must accept this file: in their scripts folder
            folder = (
                Path(settings.replay_scripts_dir).expanduser() if settings.replay_scripts_dir else opts.out
            )
            script = (folder / "sandfleet-loadtest.json").resolve()
            script.write_text(json.dumps(replay_script(opts.program)))
            model = replay_model_name(script, opts.model_latency_s)
        plan = make_plan(opts, model, warmup=0)
        with Client(redis_url, settings=settings) as client:
            owners = _fleet_owner_labels(client)
            sampler = FleetSampler(owners=owners or None, worker_pids=None)
            data = run_load(client, plan, sampler=sampler, progress_stream=opts.progress)
        described = {
            "local": False,
            "redis_url": redis_url,
            "model_latency_s": opts.model_latency_s,
            "containers_counted": (
                "containers owned by the fleet's announced workers"
                if owners
                else "every sandfleet.role container on this engine (the fleet's workers are not known)"
            ),
        }
        report = build_report(data, described)
        if opts.metrics_urls:
            report["metrics"] = scraped_metrics(opts.metrics_urls)
    write_report(report, opts.out)
    if opts.plot:
        write_plot(report, opts.out)
    return report


def scraped_metrics(urls: list[str]) -> dict[str, Any]:
    """The summary of the workers' Prometheus metrics (loadtest/scrape.py)."""
    from sandfleet.fleet.loadtest.scrape import scrape_all, summarize

    samples, failed = scrape_all(urls)
    return summarize(samples, failed)


def run_on_fleet(
    fleet: LocalFleet, plan: LoadPlan, *, progress: TextIO | None = sys.stderr
) -> dict[str, Any]:
    """Drive a started :class:`LocalFleet` with ``plan``; returns the report (nothing written)."""
    config = fleet.config
    sampler = FleetSampler(owners=fleet.owner_labels(), worker_pids=fleet.worker_pids())
    with Client(fleet.redis_url, settings=Settings(redis_url=fleet.redis_url)) as client:
        data = run_load(client, plan, sampler=sampler, progress_stream=progress)
    described = {
        "local": True,
        "redis_url": fleet.redis_url,
        "workers": config.workers,
        "concurrency": config.concurrency,
        "sandboxes": config.sandboxes,
        "worker_env": config.env,
        "model_latency_s": config.model_latency_s,
        "containers_counted": "containers owned by the workers started here",
    }
    return build_report(data, described)


def make_plan(opts: LoadTestOptions, model: str, warmup: int) -> LoadPlan:
    """The driver's plan from the options; ``warmup`` applies unless ``opts.warmup`` is set."""
    return LoadPlan(
        jobs=opts.jobs,
        question=opts.question,
        tools=tool_names(opts.tools_module),
        model=model,
        sandbox=opts.sandbox,
        rate=opts.rate,
        batch=opts.batch,
        timeout_s=opts.wait_s(),
        warmup=warmup if opts.warmup is None else opts.warmup,
    )


def _fleet_owner_labels(client: Client) -> set[str]:
    """Sandbox owner labels the fleet's workers announced (sandfleet/worker/delivery/recovery.py), if they did."""
    owners = set()
    for name in text_list(client.redis.smembers(client.keys.workers)):
        owner = text_or_none(client.redis.hget(client.keys.worker_info(name), "owner"))
        if owner:
            owners.add(owner)
    return owners
