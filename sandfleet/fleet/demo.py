"""``sandfleet demo``: the reference scenario end to end through the fleet, starting what is missing.

Redis is the fleet's (``SANDFLEET_REDIS_URL``, which deploy/bootstrap.sh starts on 6379) when it answers,
else a throwaway ``redis-server`` on a free port. The demo always starts its own worker (the example
order tools, freshly generated reference data) under a key prefix of its own, so its job goes to that
worker and to no other fleet on the same Redis; Flower on localhost, started before the job so its
tasks page shows it; and, unless a real model is configured (``OPENAI_API_KEY``, a base URL, or
``--model``), the replay model answering with the reference program. It submits the reference question
with the producer ``Client``, waits, prints the RESULT beside the plain-Python totals, and stops
everything it started (not with ``--keep-running``).

With ``--compare`` it also submits the question as a chat job (the same tool and data, a plain
tool-calling loop, no sandbox) and shows both answers side by side, checked against the totals. The
replay model plays back the reference run there: the reference program for code-action, and for
chat the reference chat agent's reply, which read all 500 rows and still got two totals wrong. With a
real model both answers are live.
"""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import click

from sandfleet.core.console import echo, echo_json, escape_line, json_text
from sandfleet.core.settings import Settings, get_settings
from sandfleet.fleet.local import SANDFLEET_ARGV, FleetConfig, LocalFleet, WorkerProcess
from sandfleet.fleet.local_redis import free_port

DEMO_TOOLS = "sandfleet.worker.tools.examples.orders"
DEMO_TOOL_NAMES = ["load_orders"]
FLOWER_PORT = 5555  # used when free, else any free port
REDIS_PROBE_TIMEOUT_S = 1.0
START_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 30.0
DEFAULT_TIMEOUT_S = 120.0
CENT = 0.005


# The reference chat agent's answer (DESIGN.md, "The reference scenario"): it read all 500 rows and
# reported these totals; North America and LATAM are wrong (108,664.00 and 81,328.00 are right).
REFERENCE_CHAT_TOTALS = {"North America": 109555.0, "LATAM": 79585.0, "EMEA": 77689.0, "APAC": 65023.0}
TOOL_LOOP_PROMPT = "(?i)with the help of the tools"  # matches the shell and chat system prompt


def reference_chat_reply() -> str:
    """The reference chat agent's final reply, as the replay model plays it back."""
    lines = "\n".join(
        f"{n}. {region}: ${total:,.2f}" for n, (region, total) in enumerate(REFERENCE_CHAT_TOTALS.items(), 1)
    )
    return (
        "I went through all 500 orders and added up quantity times unit price for July to September "
        f"2026, per region:\n\n{lines}\n\nRESULT: {json.dumps(REFERENCE_CHAT_TOTALS)}"
    )


def demo_replay_script() -> dict[str, Any]:
    """The replay script (deploy/demo/replay.json): the reference question gets the reference program
    from a code-action job, and the reference chat agent's calls and reply from a chat job."""
    from sandfleet.worker.tools.examples.scenario import REFERENCE_PROGRAM

    reply = (
        "I will load the orders with the load_orders tool, keep July to September 2026, and sum "
        f"quantity times unit price per region.\n\n```python\n{REFERENCE_PROGRAM}```\n"
    )
    other = "```python\nprint('RESULT: \"this replay model only knows the reference question\"')\n```\n"
    chat = [{"tool_calls": [{"name": "load_orders", "arguments": {}}]}, reference_chat_reply()]
    return {
        "rules": [
            {"match": "(?i)revenue per region in Q3 2026", "system": TOOL_LOOP_PROMPT, "responses": chat},
            {"match": "(?i)revenue per region in Q3 2026", "responses": [reply]},
        ],
        "default": [other],
    }


def choose_model(option: str | None, settings: Settings) -> str | None:
    """The model to use, or None for the replay model: --model, else the configured one when a key or
    a base URL says a real model is reachable (or it is a replay script already)."""
    if option:
        return option
    if settings.model_api_key or settings.model_base_url or settings.model.startswith("replay:"):
        return settings.model
    return None


def payload_totals(payload: Any) -> list[tuple[str, float]] | None:
    """``[(region, total), ...]`` in the payload's order, from ``{region: total}`` or a list of pairs or
    of ``{"region": .., <number>: ..}`` objects; None when the payload has another shape."""
    try:
        if isinstance(payload, dict):
            return [(str(k), float(v)) for k, v in payload.items()]
        if isinstance(payload, list):
            rows = []
            for item in payload:
                if isinstance(item, dict):
                    numbers = [v for k, v in item.items() if k != "region" and isinstance(v, int | float)]
                    rows.append((str(item["region"]), float(numbers[0])))
                else:
                    region, total = item
                    rows.append((str(region), float(total)))
            return rows
    except (KeyError, IndexError, TypeError, ValueError):
        return None
    return None


def totals_match(payload: Any, expected: dict[str, float]) -> bool:
    """Same regions, same totals to the cent, highest first."""
    got = payload_totals(payload)
    if got is None or [r for r, _ in got] != list(expected):
        return False
    return all(abs(total - expected[region]) < CENT for region, total in got)


def format_comparison(payload: Any, expected: dict[str, float]) -> str:
    """The fleet's totals beside the plain-Python ones, one region a line."""
    got = dict(payload_totals(payload) or [])
    lines = [f"  {'region':<16}{'fleet (RESULT)':>16}{'plain Python':>16}"]
    for region, want in expected.items():
        have = got.get(region)
        shown = f"{have:,.2f}" if have is not None else "-"
        lines.append(f"  {region:<16}{shown:>16}{want:>16,.2f}")
    return "\n".join(lines)


def redis_answers(url: str) -> bool:
    import redis

    from sandfleet.core.redis_connect import connect
    from sandfleet.core.settings import get_settings

    client = connect(url, get_settings(), socket_connect_timeout=REDIS_PROBE_TIMEOUT_S, socket_timeout=2.0)
    try:
        return bool(client.ping())
    except redis.RedisError:
        return False
    finally:
        client.close()


def check_sandbox_ready() -> None:
    """Fail early (SandfleetError) without an engine or the sandbox image: the job would only wait."""
    from sandfleet.core.config import SandboxConfig
    from sandfleet.core.errors import SandboxUnavailableError
    from sandfleet.worker.sandbox.docker.backend import engine_info

    image = SandboxConfig().image
    if image not in engine_info().images:
        raise SandboxUnavailableError(f"the sandbox image {image} is missing: run `sandfleet images build`")


@dataclass
class DemoStack:
    """What the demo started: a local fleet (its own worker, and Redis only if the fleet's does not
    answer) and Flower. ``stop`` ends exactly those."""

    fleet: LocalFleet
    flower: subprocess.Popen[bytes] | None = None
    flower_log: IO[bytes] | None = None

    @property
    def settings(self) -> Settings:
        return self.fleet.settings

    @property
    def worker(self) -> WorkerProcess:
        return self.fleet.workers[0]

    def pids(self) -> dict[str, int]:
        pids = {"worker": self.worker.process.pid}
        if self.fleet.redis is not None and self.fleet.redis.process is not None:
            pids["redis"] = self.fleet.redis.process.pid
        if self.flower is not None:
            pids["flower"] = self.flower.pid
        return pids

    def start_worker(self) -> None:
        self.fleet.start_worker(f"demo-{self.fleet.token}", wait=False)

    def start_flower(self, port: int) -> str:
        self.flower_log = open(self.fleet.folder / "flower.log", "ab")  # noqa: SIM115 - closed in stop()
        self.flower = subprocess.Popen(
            [*SANDFLEET_ARGV, "flower", f"--port={port}", "--address=127.0.0.1"],
            env=self.fleet.worker_env(),
            stdout=self.flower_log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        url = f"http://127.0.0.1:{port}/"
        deadline = time.monotonic() + START_TIMEOUT_S
        while not _http_ok(url + "healthcheck"):
            if self.flower.poll() is not None or time.monotonic() > deadline:
                tail = (self.fleet.folder / "flower.log").read_text(errors="replace")[-2000:]
                raise click.ClickException(f"Flower did not start within {START_TIMEOUT_S:g} s:\n{tail}")
            time.sleep(0.1)
        return url

    def stop(self) -> None:
        """Flower and the fleet (the worker's warm shutdown drains its sandbox pool; then our Redis)."""
        if self.flower is not None and self.flower.poll() is None:
            self.flower.send_signal(signal.SIGTERM)
            try:
                self.flower.wait(timeout=STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                self.flower.kill()
                self.flower.wait()
        if self.flower_log is not None:
            self.flower_log.close()
        self.fleet.stop()


def _http_ok(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=1.0) as response:
            return bool(response.status == 200)
    except OSError:
        return False


@click.command()
@click.option(
    "--model",
    default=None,
    help="provider:model (default: the replay model, or the configured "
    "model when OPENAI_API_KEY or a base URL is set).",
)
@click.option("--no-flower", is_flag=True, help="Do not start Flower.")
@click.option(
    "--keep-running", is_flag=True, help="Leave what the demo started running (it prints how to stop it)."
)
@click.option(
    "--timeout",
    "timeout_s",
    default=DEFAULT_TIMEOUT_S,
    show_default=True,
    type=float,
    help="Seconds to wait for the job.",
)
@click.option(
    "--compare",
    is_flag=True,
    help="Also run the question as a chat job (the baseline) and compare the answers.",
)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead of the report.")
def demo(
    model: str | None, no_flower: bool, keep_running: bool, timeout_s: float, compare: bool, as_json: bool
) -> None:
    """Run the reference question (Q3 2026 revenue per region) through the fleet; exit 0 when the fleet's
    RESULT matches the plain-Python totals."""
    from sandfleet.core.errors import SandfleetError
    from sandfleet.producer.client import Client
    from sandfleet.worker.tools.examples.scenario import (
        REFERENCE_QUESTION,
        expected_q3_revenue,
        generate_orders,
    )

    say = (lambda text: echo(text, err=True)) if as_json else echo
    base = get_settings()
    chosen = choose_model(model, base)
    try:
        check_sandbox_ready()
        if chosen and not chosen.startswith("replay:"):
            from sandfleet.worker.llm.client import make_model_client

            make_model_client(chosen, base)  # refuses a missing key now, not after the job ran
    except SandfleetError as e:
        raise click.ClickException(str(e)) from None
    folder = Path(tempfile.mkdtemp(prefix="sandfleet-demo-"))
    prefix = f"{base.key_prefix}-demo-{uuid.uuid4().hex[:8]}"
    report: dict[str, Any] = {"question": REFERENCE_QUESTION, "key_prefix": prefix, "started": []}
    stack = DemoStack(demo_fleet(base, folder, prefix, chosen, report, say))
    finished = False
    try:
        _start(stack, report, with_flower=not no_flower, say=say)
        began = time.monotonic()
        with Client(settings=stack.settings) as client:
            # No model named: the job takes its worker's, report["model"], which this command's user
            # chose (a replay: script anywhere is theirs to name; a job could name only the worker's
            # SANDFLEET_REPLAY_SCRIPTS_DIR).
            job = client.submit(REFERENCE_QUESTION, tools=DEMO_TOOL_NAMES)
            say(f"job {job.job_id}: submitted; waiting (at most {timeout_s:g} s)")
            chat_job = None
            if compare:
                chat_job = client.submit(REFERENCE_QUESTION, tools=DEMO_TOOL_NAMES, mode="chat")
                say(f"job {chat_job.job_id}: the same question as a chat job (the baseline)")
            result = _wait(job, stack, timeout_s)
            chat_result = _wait(chat_job, stack, timeout_s) if chat_job is not None else None
        expected = expected_q3_revenue(generate_orders())
        if chat_result is not None:
            report["compare"] = [
                _compared("code-action", result, expected),
                _compared("chat", chat_result, expected),
            ]
        report.update(
            job_id=job.job_id,
            status=result.status.value,
            elapsed_s=round(time.monotonic() - began, 2),
            result=result.result,
            expected=expected,
            match=totals_match(result.result, expected),
            error=result.error.model_dump(mode="json") if result.error else None,
        )
        finished = True
    except SandfleetError as e:
        raise click.ClickException(str(e)) from None
    finally:
        if keep_running and finished:
            report["running"] = stack.pids()
            report["folder"] = str(folder)
        else:  # a failed demo never leaves anything behind
            stack.stop()
            shutil.rmtree(folder, ignore_errors=True)
    _print_report(report, as_json, keep_running)
    sys.exit(0 if report["match"] else 1)


def demo_fleet(
    base: Settings, folder: Path, prefix: str, model: str | None, report: dict[str, Any], say: Any
) -> LocalFleet:
    """The demo's fleet: the fleet's Redis when it answers (else one of its own), the example order
    tools, fresh reference data, and ``model`` (None: the replay model with the reference program)."""
    from sandfleet.core.queue import redact_url

    if model is None:
        script = folder / "demo-replay.json"
        script.write_text(json.dumps(demo_replay_script(), indent=2))
        model = f"replay:{script}"
    report["model"] = model
    config = FleetConfig(
        workers=0,
        concurrency=4,
        sandboxes=2,
        tools=DEMO_TOOLS,
        loglevel="info",
        env={"SANDFLEET_MODEL": model},
        inherit_settings=True,  # the user's model endpoint and other settings pass through
    )
    if redis_answers(base.redis_url):
        report["redis_url"] = redact_url(base.redis_url)
        say(f"Redis   {report['redis_url']} (already running)")
        return LocalFleet(config, folder, redis_url=base.redis_url, key_prefix=prefix)
    fleet = LocalFleet(config, folder, key_prefix=prefix)
    fleet.prepare()
    report["redis_url"] = fleet.redis_url
    report["started"].append("redis")
    say(f"Redis   {fleet.redis_url} (started: {redact_url(base.redis_url)} did not answer)")
    return fleet


def _start(stack: DemoStack, report: dict[str, Any], *, with_flower: bool, say: Any) -> None:
    """Start the worker, and Flower before the job (Flower only shows tasks whose events it saw)."""
    stack.start_worker()
    report["started"].append("worker")
    fleet = stack.fleet
    say(f"worker  started (tools {DEMO_TOOLS}, data {fleet.data_dir}, key prefix {fleet.key_prefix})")
    say(f"model   {report['model']}")
    if with_flower:
        report["flower_url"] = stack.start_flower(free_port(FLOWER_PORT)) + "tasks"
        report["started"].append("flower")
        say(f"Flower  {report['flower_url']}")


def _wait(job: Any, stack: DemoStack, timeout_s: float) -> Any:
    """The job's result; fails at once when the worker dies, quoting its log."""
    deadline = time.monotonic() + timeout_s
    while True:
        if not stack.worker.alive():
            code = stack.worker.process.returncode
            raise click.ClickException(f"the worker exited with {code}:\n{stack.worker.log_tail()}")
        try:
            return job.result(timeout=min(2.0, max(0.1, deadline - time.monotonic())))
        except TimeoutError:
            if time.monotonic() >= deadline:
                raise click.ClickException(
                    f"job {job.job_id} has not ended after {timeout_s:g} s; worker log:\n{stack.worker.log_tail()}"
                ) from None


def _compared(mode: str, result: Any, expected: dict[str, float]) -> dict[str, Any]:
    """One job of ``--compare``: its answer, figures and check against the plain-Python totals."""
    from sandfleet.worker.cli.answers import check_answer

    check = check_answer(expected, result.result)
    return {
        "mode": mode,
        "job_id": result.job_id,
        "status": result.status.value,
        "result": result.result,
        "model_calls": result.usage.model_calls,
        "tokens": result.usage.prompt_tokens + result.usage.completion_tokens,
        "tool_calls": result.tool_calls,
        "seconds": round(result.timings.get("total_s", 0.0), 2),
        "matches": check.matches,
        "check": check.summary(),
    }


def format_side_by_side(rows: list[dict[str, Any]], expected: dict[str, float]) -> str:
    """Each region's total by mode beside the plain-Python one, then each mode's figures."""
    from sandfleet.worker.cli.answers import as_mapping

    got = [as_mapping(r["result"]) or {} for r in rows]
    head = "".join(f"{r['mode']:>16}" for r in rows)
    lines = [f"  {'region':<16}{head}{'plain Python':>16}"]
    for region, want in expected.items():
        cells = ""
        for mapping in got:
            value = mapping.get(region)
            shown = f"{value:,.2f}" if isinstance(value, int | float) else "-"
            mark = " " if isinstance(value, int | float) and abs(value - want) < CENT else "*"
            cells += f"{shown + mark:>16}"
        lines.append(f"  {region:<16}{cells}{want:>16,.2f}")
    lines.append("  (* differs from plain Python)")
    for r in rows:
        lines.append(
            f"  {r['mode']:<12} {r['status']}: {r['model_calls']} model calls, {r['tokens']:,} tokens, "
            f"{r['tool_calls']} tool calls, {r['seconds']} s; matches: {escape_line(r['check'])}"
        )
    return "\n".join(lines)


def _print_report(report: dict[str, Any], as_json: bool, keep_running: bool) -> None:
    if as_json:
        echo_json(report)
        return
    echo(f"job {report['job_id']}: {report['status']} in {report['elapsed_s']} s")
    if report.get("error"):
        echo(f"  error: {report['error']['kind']}: {report['error']['message']}")
    echo(f"RESULT: {json_text(report['result'])}")
    echo(format_comparison(report["result"], report["expected"]))
    echo(f"match: {'yes' if report['match'] else 'NO'}")
    if "compare" in report:
        echo("\ncode-action beside chat (the same question, tool and data; chat has no sandbox):")
        echo(format_side_by_side(report["compare"], report["expected"]))
        if report["model"].startswith("replay:"):
            echo("  (replay model: it plays back the reference run's program and chat reply)")
    if "flower_url" in report:
        state = "still running" if keep_running else "stopped now; --keep-running keeps it up"
        echo(f"Flower: {report['flower_url']} ({state})")
    if keep_running and report.get("running"):
        pids = " ".join(str(pid) for pid in report["running"].values())
        echo(f"running: {report['running']}; stop with: kill {pids}; scratch folder {report['folder']}")
