"""``sandfleet compare QUESTION``: the same question as a code-action job and as a chat job, side by side.

Both run in this process (no Redis, no Celery), one after the other, with the same tools, model and
options; code-action sandboxed as always, chat with the tools on the host and no sandbox (the baseline).
For each: the status, the answer, model calls, tokens, tool calls and time; with ``--expect FILE`` (a
JSON answer) whether it matches, field by field (sandfleet/worker/cli/answers.py). Exit 0 once every job ran,
whatever the answers; 1 when a job could not run at all.
"""

from __future__ import annotations

import json
import sys
import uuid
from pathlib import Path
from typing import Any

import click

from sandfleet.core.console import echo, echo_json, escape_line
from sandfleet.core.errors import SandfleetError
from sandfleet.core.options import parse_options, sandbox_option
from sandfleet.core.validation_text import describe_validation_error
from sandfleet.worker.cli.common import tools_option

DEFAULT_MODES = "code-action,chat"
ANSWER_SHOWN_CHARS = 400


@click.command()
@click.argument("question")
@tools_option
@click.option("--model", default=None, help="provider:model, e.g. openai:gpt-5-mini or replay:script.json.")
@click.option("--base-url", default=None, help="OpenAI-compatible endpoint for these jobs.")
@sandbox_option
@click.option(
    "--expect",
    "expect_file",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    default=None,
    help="A JSON file holding the expected answer; each job is checked against it.",
)
@click.option(
    "--modes",
    default=DEFAULT_MODES,
    show_default=True,
    help="The modes to run, comma-separated (code-action, shell, chat).",
)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object: each mode's figures and check.")
def compare(
    question: str,
    tool_modules: tuple[str, ...],
    model: str | None,
    base_url: str | None,
    options: tuple[str, ...],
    expect_file: Path | None,
    modes: str,
    as_json: bool,
) -> None:
    """Answer QUESTION as a code-action job and as a chat job (the baseline); print them side by side."""
    from pydantic import ValidationError

    from sandfleet.core.contracts import JobMode, JobSpec
    from sandfleet.core.settings import get_settings
    from sandfleet.worker.cli.common import tool_specs
    from sandfleet.worker.engine import EngineOptions, EngineServices, NullAudit, run_job
    from sandfleet.worker.llm.client import ModelTrust
    from sandfleet.worker.tools.registry import ToolRegistry

    settings = get_settings()
    expected = _read_expected(expect_file)
    try:
        chosen = [JobMode(m.strip()) for m in modes.split(",") if m.strip()]
    except ValueError:
        raise click.UsageError(f"--modes: use code-action, shell or chat (got {modes!r})") from None
    try:
        registry = ToolRegistry.from_modules(tool_specs(tool_modules, settings))
        specs = [
            JobSpec(
                question=question, mode=m, tools=registry.names(), model=model, sandbox=parse_options(options)
            )
            for m in chosen
        ]
    except ValidationError as e:
        raise click.UsageError(describe_validation_error(e, root="options", sep="\n")) from None
    except SandfleetError as e:
        raise click.ClickException(str(e)) from None
    rows = []
    try:
        with EngineServices.start(
            settings,
            EngineOptions(
                registry=registry,
                pool_size=0,
                max_sandboxes=1,
                job_model_trust=ModelTrust.OPERATOR,  # the model is this command's user's: any file
            ),
        ) as services:
            # refuse a missing key before any work
            services.model_client(model or settings.model, base_url, trust=ModelTrust.OPERATOR)
            for spec in specs:
                result = run_job(
                    spec,
                    f"compare-{uuid.uuid4().hex[:12]}",
                    services=services,
                    audit=NullAudit(),
                    base_url=base_url,
                )
                rows.append(_row(spec.mode.value, result, expected))
    except SandfleetError as e:
        raise click.ClickException(str(e)) from None
    if as_json:
        echo_json({"question": question, "expected": expected, "jobs": rows})
    else:
        echo(format_table(rows, with_check=expected is not None))
    sys.exit(0)


def _read_expected(path: Path | None) -> Any:
    if path is None:
        return None
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise click.UsageError(f"--expect {path}: not a JSON file ({e})") from None


def _row(mode: str, result: Any, expected: Any) -> dict[str, Any]:
    """One mode's figures (and check) from its JobResult."""
    from sandfleet.worker.cli.answers import check_answer

    row: dict[str, Any] = {
        "mode": mode,
        "job_id": result.job_id,
        "status": result.status.value,
        "answer": result.result,
        "error": f"{result.error.kind}: {result.error.message}" if result.error else None,
        "model_calls": result.usage.model_calls,
        "prompt_tokens": result.usage.prompt_tokens,
        "completion_tokens": result.usage.completion_tokens,
        "tool_calls": result.tool_calls,
        "seconds": round(result.timings.get("total_s", 0.0), 3),
    }
    if expected is not None:
        check = check_answer(expected, result.result) if result.result is not None else None
        row["matches"] = bool(check and check.matches)
        row["check"] = check.summary() if check else "NO: no answer"
    return row


def format_table(rows: list[dict[str, Any]], *, with_check: bool) -> str:
    """The modes side by side: one column each, one line per figure, then each answer in full."""
    label_width = 13
    width = max(24, *(len(r["mode"]) + 2 for r in rows))
    lines = [" " * label_width + "".join(f"{r['mode']:<{width}}" for r in rows)]

    def line(label: str, values: list[str]) -> None:
        lines.append(f"{label:<{label_width}}" + "".join(f"{v:<{width}}" for v in values))

    line("status", [r["status"] for r in rows])
    line("model calls", [str(r["model_calls"]) for r in rows])
    line("tokens", [f"{r['prompt_tokens'] + r['completion_tokens']:,}" for r in rows])
    line("tool calls", [str(r["tool_calls"]) for r in rows])
    line("time", [f"{r['seconds']:.2f} s" for r in rows])
    if with_check:
        line("matches", ["yes" if r["matches"] else "NO" for r in rows])
    for r in rows:
        answer = r["answer"] if isinstance(r["answer"], str) else json.dumps(r["answer"], ensure_ascii=False)
        lines.append(f"\n{r['mode']} answer: {_short(answer) if r['answer'] is not None else '-'}")
        if r["error"]:
            lines.append(f"{r['mode']} error: {escape_line(r['error'])}")
        if with_check:
            lines.append(f"{r['mode']} matches the expected answer: {r['check']}")
    return "\n".join(lines)


def _short(text: str) -> str:
    """The answer on one line (the model's text: escaped), cut at ANSWER_SHOWN_CHARS."""
    flat = " ".join(text.split())
    return escape_line(flat if len(flat) <= ANSWER_SHOWN_CHARS else flat[:ANSWER_SHOWN_CHARS] + " ...")
