"""Shell mode's costs: sandbox_exec("true") against `docker exec`, and the engine's overhead per chat turn.

    flock /work/bench.lock .venv/bin/python benchmarks/shell_exec.py [--runs 200] [--runtime runc]
        [--jobs 50] [--turns 5] [--json]

1. One session sandbox (a real SessionKeeper session, the hardened container shell jobs get). On it,
   alternating so that both see the same host load:
   - ``sandbox_exec("true")``: the tool as the model calls it (caps, bash -c in /workspace through the
     sandbox agent, head and tail of the output);
   - ``docker exec`` of the same ``bash -c true``, as the same user in the same folder, on the same
     container: through the Docker SDK (``exec_run``, the engine API) and through the Docker CLI.
   Median and p95 of each, and the ratios (target: sandbox_exec at least 3x faster than docker exec).
2. Chat jobs through the real engine (run_job, chat mode): a zero-latency replay server over HTTP,
   the real openai client, ``--turns`` replies that each call a trivial tool, then the answer. Per job

       engine overhead per turn = (total_s - model_s) / turns

   where ``model_s`` is the client's wall time for the model calls (HTTP included): what is left is
   the loop's own work (messages, schemas, dispatch, the tool, clipping, records, audit). Audit events
   go to memory, and, when ``redis-server`` is installed, also to a real Redis stream with the hash
   chain, as in the fleet (three appends per turn, each a Redis round trip, printed beside it).
   Target: under 2 ms per turn.

Needs Docker and the sandbox image. Run it under the machine-wide benchmark lock; other engineers'
work may load a shared host: compare the ratios, which are measured side by side in one run.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from _common import fmt, summary_ms

DEFAULT_RUNS = 200
DEFAULT_JOBS = 50
DEFAULT_TURNS = 5
WARMUP = 5
TARGET_EXEC_RATIO = 3.0
TARGET_TURN_MS = 2.0


def exec_round_trips(runs: int, runtime: str) -> dict[str, list[float]]:
    """Seconds per round trip of sandbox_exec("true"), SDK exec_run and CLI docker exec, interleaved."""
    from sandfleet.core.config import SandboxConfig, ToolLoopSettings
    from sandfleet.core.settings import Settings
    from sandfleet.worker.engine.shell.keeper import SessionKeeper
    from sandfleet.worker.engine.shell.tools import PackageSources, ShellTools
    from sandfleet.worker.sandbox.docker.backend import docker_client
    from sandfleet.worker.sandbox.docker.spec import SANDBOX_GID, SANDBOX_UID

    backend = "gvisor" if runtime.startswith("runsc") else "docker"
    keeper = SessionKeeper(Settings(model_api_key=None, model_base_url=None))
    samples: dict[str, list[float]] = {"sandbox_exec": [], "docker_exec_sdk": [], "docker_exec_cli": []}
    try:
        session = keeper.open(
            SandboxConfig(backend=backend), job_id="bench-shell-exec", lifetime_s=3600, idle_s=3600, wait_s=60
        )
        tools = ShellTools(
            session,
            caps=ToolLoopSettings(),
            settings=keeper.settings,
            deadline=time.monotonic() + 3600,
            sources=PackageSources(),
        )
        container = docker_client().containers.get(session.container.id)
        user, workdir, argv = (
            f"{SANDBOX_UID}:{SANDBOX_GID}",
            session.container.config.workdir,
            ["bash", "-c", "true"],
        )
        cli = ["docker", "exec", "-u", user, "-w", workdir, session.container.id, *argv]

        def via_tool() -> None:
            done = tools.sandbox_exec("true")
            if done["exit_code"] != 0:
                raise SystemExit(f"sandbox_exec('true') failed: {done}")

        def via_sdk() -> None:
            code, _ = container.exec_run(argv, user=user, workdir=workdir)
            if code != 0:
                raise SystemExit(f"docker exec (SDK) failed with {code}")

        def via_cli() -> None:
            subprocess.run(cli, check=True, capture_output=True, timeout=60)

        steps = {"sandbox_exec": via_tool, "docker_exec_sdk": via_sdk, "docker_exec_cli": via_cli}
        for number in range(WARMUP + runs):
            for name, step in steps.items():
                began = time.perf_counter()
                step()
                if number >= WARMUP:
                    samples[name].append(time.perf_counter() - began)
    finally:
        keeper.close()
    return samples


def redis_round_trips(redis_url: str, runs: int) -> list[float]:
    """Seconds per PING to the same Redis: the floor under each audit append (one round trip each)."""
    import redis

    client = redis.Redis.from_url(redis_url)
    try:
        samples = []
        for _ in range(runs):
            began = time.perf_counter()
            client.ping()
            samples.append(time.perf_counter() - began)
        return samples
    finally:
        client.close()


def chat_turns(jobs: int, turns: int, audit_to: str, redis_url: str | None) -> list[float]:
    """Engine overhead per turn of each chat job, in seconds."""
    from sandfleet.core.contracts import JobSpec, JobStatus
    from sandfleet.core.settings import Settings
    from sandfleet.worker.engine import EngineServices, NullAudit, run_job
    from sandfleet.worker.llm.scripted.script import parse_script
    from sandfleet.worker.llm.scripted.server import ReplayServer
    from sandfleet.worker.sandbox.pool import SandboxPool
    from sandfleet.worker.tools.registry import ToolRegistry

    def lookup(key: str) -> dict:
        """A trivial tool: the model's argument back, with a small record."""
        return {"key": key, "value": len(key), "tags": ["a", "b"]}

    call = {"tool_calls": [{"name": "lookup", "arguments": {"key": "order-42"}}]}
    script = parse_script({"rules": [{"match": ".", "responses": [call] * turns + ["RESULT: 42"]}]})
    settings = Settings(model_api_key=None, model_base_url=None, model_max_retries=0)
    registry = ToolRegistry.from_functions([lookup])
    spec = JobSpec(question="Look it up", tools=["lookup"], model="openai:replay", mode="chat")
    store = None
    key_dir: Path | None = None
    if audit_to == "redis":
        from sandfleet.core.signing import FileSigner
        from sandfleet.core.store import JobStore

        # a worker's signing key of its own (audit events are written only signed), in a temp folder
        key_dir = Path(tempfile.mkdtemp(prefix="sandfleet-bench-key-"))
        signer = FileSigner(key_dir / "bench.pem", "bench")
        store = JobStore.from_settings(settings.model_copy(update={"redis_url": redis_url}), signer)
    per_turn = []
    with (
        ReplayServer(script) as server,
        EngineServices(settings, SandboxPool(pool_size=0, max_live=1), registry) as services,
    ):
        for number in range(WARMUP + jobs):
            job_id = f"bench-chat-{number:04d}"
            audit: Any = NullAudit()
            if store is not None:  # a queued, running record, as a worker's job has (the chain needs it)
                store.record_queued([(job_id, spec)])
                store.mark_running(job_id, "bench")
                audit = store.audit_sink(job_id)
            result = run_job(spec, job_id, services=services, audit=audit, base_url=server.base_url)
            if result.status != JobStatus.SUCCEEDED or result.result != 42:
                raise SystemExit(f"chat job {number} did not answer: {result.status} {result.error}")
            if number >= WARMUP:
                t = result.timings
                per_turn.append((t["total_s"] - t["model_s"]) / result.usage.model_calls)
    if store is not None:
        store.redis.close()
    if key_dir is not None:
        shutil.rmtree(key_dir, ignore_errors=True)
    return per_turn


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--runs", type=int, default=DEFAULT_RUNS, help="round trips of each kind (default 200)"
    )
    parser.add_argument("--runtime", default="runc", choices=["runc", "runsc"], help="the session's runtime")
    parser.add_argument("--jobs", type=int, default=DEFAULT_JOBS, help="chat jobs measured (default 50)")
    parser.add_argument("--turns", type=int, default=DEFAULT_TURNS, help="tool-calling turns per chat job")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = parser.parse_args(argv)

    exec_samples = exec_round_trips(args.runs, args.runtime)
    turn_samples = {"memory": chat_turns(args.jobs, args.turns, "memory", None)}
    if shutil.which("redis-server"):
        from sandfleet.fleet.local_redis import RedisServer

        with tempfile.TemporaryDirectory(prefix="sandfleet-bench-redis-") as folder:
            server = RedisServer(Path(folder)).start()
            try:
                turn_samples["redis"] = chat_turns(args.jobs, args.turns, "redis", server.url)
                ping = summary_ms(redis_round_trips(server.url, max(50, args.runs)))
            finally:
                server.stop()

    if "redis" not in turn_samples:
        ping = None
    stats = {name: summary_ms(values) for name, values in exec_samples.items()}
    turns = {name: summary_ms(values) for name, values in turn_samples.items()}
    ratios = {
        "sdk_over_tool_median": stats["docker_exec_sdk"]["median"] / stats["sandbox_exec"]["median"],
        "sdk_over_tool_p95": stats["docker_exec_sdk"]["p95"] / stats["sandbox_exec"]["p95"],
        "cli_over_tool_median": stats["docker_exec_cli"]["median"] / stats["sandbox_exec"]["median"],
    }
    figures: dict[str, Any] = {
        "runtime": args.runtime,
        "host_cpus": os.cpu_count(),
        "exec_ms": stats,
        "exec_ratios": ratios,
        "chat_turn_overhead_ms": turns,
        "turns_per_job": args.turns + 1,
        "redis_ping_ms": ping,
    }
    if args.json:
        print(json.dumps(figures, indent=2))
        return 0
    print(f'round trip of "true" on one session sandbox ({args.runtime}), {args.runs} each, interleaved')
    for name, label in (
        ("sandbox_exec", 'sandbox_exec("true")'),
        ("docker_exec_sdk", "docker exec (SDK)"),
        ("docker_exec_cli", "docker exec (CLI)"),
    ):
        print(f"  {label:<22}{fmt(stats[name])}")
    target = "met" if ratios["sdk_over_tool_median"] >= TARGET_EXEC_RATIO else "NOT met"
    print(
        f"docker exec / sandbox_exec: median {ratios['sdk_over_tool_median']:.1f}x (SDK), "
        f"{ratios['cli_over_tool_median']:.1f}x (CLI); p95 {ratios['sdk_over_tool_p95']:.1f}x (SDK) "
        f"(target >= {TARGET_EXEC_RATIO:g}x: {target})"
    )
    print(f"engine overhead per chat turn, model excluded ({args.jobs} jobs of {args.turns + 1} turns)")
    for name, values in turns.items():
        verdict = "met" if values["median"] < TARGET_TURN_MS else "NOT met"
        print(f"  audit to {name:<8}{fmt(values)}  (target < {TARGET_TURN_MS:g} ms: {verdict})")
    if ping is not None:
        print(
            f"  (audit to redis: 3 chained appends per turn, one round trip each; a PING round trip "
            f"here: median {ping['median']:.3f} ms, p95 {ping['p95']:.3f} ms)"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
