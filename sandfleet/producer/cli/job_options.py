"""The job options that ``sandfleet submit`` and ``sandfleet batch`` share, and the JobSpec fields
they make. For a batch they are defaults: a row's own columns override them (sandfleet/producer/defaults.py)."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any, TypeVar

import click

from sandfleet.core.options import parse_options, sandbox_option
from sandfleet.core.priority import DEFAULT_BATCH_PRIORITY, DEFAULT_JOB_PRIORITY, MAX_PRIORITY, MIN_PRIORITY
from sandfleet.core.vocabulary import JobMode

F = TypeVar("F", bound=Callable[..., Any])

mode_option = click.option(
    "--mode",
    type=click.Choice([m.value for m in JobMode]),
    default=None,
    help="code-action (default: one program per attempt, in a fresh sandbox), shell (a tool loop with a "
    "session sandbox) or chat (a tool loop, no sandbox: the baseline).",
)

# Applied bottom-up: the options appear in --help in this order.
_JOB_OPTIONS = (
    click.option("--tools", default=None, help="Comma-separated names of the tools the job may call."),
    click.option(
        "--approval-tools",
        default=None,
        help="Comma-separated tools (names, globs) the job adds to the approval policy (never removes).",
    ),
    click.option("--model", default=None, help="provider:model (default: the worker's)."),
    mode_option,
    sandbox_option,
    click.option("--exec-timeout", type=float, default=None, help="Seconds one program may run."),
    click.option("--max-repairs", type=int, default=None, help="Programs rewritten after a failure."),
    click.option("--max-tool-calls", type=int, default=None, help="Tool calls per program run."),
    click.option(
        "--priority",
        type=click.IntRange(MIN_PRIORITY, MAX_PRIORITY),
        default=None,
        help=f"{MIN_PRIORITY} (lowest) to {MAX_PRIORITY} (highest): waiting jobs of higher priority start "
        f"first (default: {DEFAULT_JOB_PRIORITY} for submit, {DEFAULT_BATCH_PRIORITY} for batch jobs).",
    ),
    click.option(
        "--metadata",
        "metadata",
        multiple=True,
        metavar="KEY=VALUE",
        help="Metadata kept with the job (repeatable; JSON values parsed: -o style).",
    ),
    click.option(
        "--max-completion-tokens",
        type=click.IntRange(1),
        default=None,
        help="Tokens one model reply may have (sent with every request; default: the worker's).",
    ),
    click.option(
        "--max-job-tokens", type=click.IntRange(1), default=None, help="Prompt + completion tokens per job."
    ),
    click.option(
        "--max-model-time",
        type=click.FloatRange(min=0, min_open=True),
        default=None,
        help="Seconds the job may wait on the model, retries included; then it fails as `model`.",
    ),
    click.option(
        "--webhook", default=None, metavar="URL", help="POST a signed notice here when the job ends."
    ),
    click.option(
        "--batch-webhook",
        default=None,
        metavar="URL",
        help="POST a signed notice here when the job's whole batch has ended.",
    ),
)


def job_options(command: F) -> F:
    """Add the shared job options to a click command (keyword arguments of the same names)."""
    for option in reversed(_JOB_OPTIONS):
        command = option(command)
    return command


def parse_metadata(pairs: tuple[str, ...]) -> dict[str, Any]:
    """``("team=ops", "run=3")`` -> ``{"team": "ops", "run": 3}``; values that are JSON scalars parsed."""
    metadata: dict[str, Any] = {}
    for pair in pairs:
        key, sep, raw = pair.partition("=")
        if not sep or not key.strip():
            raise click.BadParameter(f"expected KEY=VALUE, got {pair!r}", param_hint="--metadata")
        try:
            value: Any = json.loads(raw)
        except json.JSONDecodeError:
            value = raw
        if isinstance(value, dict | list):
            value = raw  # metadata values are scalars: keep the text
        metadata[key.strip()] = value
    return metadata


def job_fields(
    *,
    tools: str | None,
    approval_tools: str | None = None,
    model: str | None,
    mode: str | None,
    options: tuple[str, ...],
    exec_timeout: float | None,
    max_repairs: int | None,
    max_tool_calls: int | None,
    priority: int | None,
    metadata: tuple[str, ...],
    max_completion_tokens: int | None = None,
    max_job_tokens: int | None = None,
    max_model_time: float | None = None,
    webhook: str | None = None,
    batch_webhook: str | None = None,
) -> dict[str, Any]:
    """The JobSpec fields the options set (only those given)."""
    fields: dict[str, Any] = {}
    if tools is not None:
        fields["tools"] = [part.strip() for part in tools.split(",") if part.strip()]
    if approval_tools is not None:
        fields["approval_tools"] = [part.strip() for part in approval_tools.split(",") if part.strip()]
    if model:
        fields["model"] = model
    if mode:
        fields["mode"] = mode
    if options:
        fields["sandbox"] = parse_options(options)
    code_action = {
        k: v
        for k, v in (
            ("exec_timeout", exec_timeout),
            ("max_repairs", max_repairs),
            ("max_tool_calls", max_tool_calls),
        )
        if v is not None
    }
    if code_action:
        fields["code_action"] = code_action
    if priority is not None:
        fields["priority"] = priority
    if metadata:
        fields["metadata"] = parse_metadata(metadata)
    model_limits = {
        k: v
        for k, v in (
            ("max_completion_tokens", max_completion_tokens),
            ("max_job_tokens", max_job_tokens),
            ("max_model_time", max_model_time),
        )
        if v is not None
    }
    if model_limits:
        fields["model_limits"] = model_limits
    if webhook:
        fields["webhook"] = webhook
    if batch_webhook:
        fields["batch_webhook"] = batch_webhook
    return fields
