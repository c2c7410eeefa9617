"""``sandfleet ask QUESTION``: one job in this process, no Redis and no Celery, sandboxed as always
(``--mode shell`` in a session sandbox; ``--mode chat`` runs no model code, only the tools, on the host).

``--out DIR`` writes the files the job's program left in /workspace/out/ under DIR, as
``sandfleet artifacts JOB --out DIR`` does for a fleet's job (each checked against the digest its
result lists; kept in this process's memory meanwhile).
"""

from __future__ import annotations

import sys
import uuid
from pathlib import Path
from typing import TYPE_CHECKING

import click

from sandfleet.core.console import echo, echo_json_text, escape_line, escape_program
from sandfleet.core.contracts import JobMode
from sandfleet.core.errors import SandfleetError
from sandfleet.core.options import parse_options, sandbox_option
from sandfleet.core.validation_text import describe_validation_error
from sandfleet.worker.cli.common import echo_payload, mcp_config_option

if TYPE_CHECKING:
    from sandfleet.core.contracts import JobResult, JobSpec
    from sandfleet.worker.tools.registry import ToolRegistry


@click.command()
@click.argument("question")
@click.option(
    "--tools",
    "tool_modules",
    multiple=True,
    metavar="FILE_OR_MODULE",
    help="Tools module(s) to load; the job may call all of their tools. Default: SANDFLEET_TOOLS.",
)
@mcp_config_option
@click.option("--model", default=None, help="provider:model, e.g. openai:gpt-5-mini or replay:script.json.")
@click.option("--base-url", default=None, help="OpenAI-compatible endpoint for this job.")
@click.option(
    "--mode",
    type=click.Choice([m.value for m in JobMode]),
    default="code-action",
    show_default=True,
    help="code-action: one program per attempt; shell: a tool loop with a session sandbox; chat: a tool "
    "loop, no sandbox.",
)
@sandbox_option
@click.option("--exec-timeout", type=float, default=None, help="Seconds each program may run (default 120).")
@click.option("--max-repairs", type=int, default=None, help="Repairs after a failed program (default 1).")
@click.option("--max-tool-calls", type=int, default=None, help="Tool calls per program (default 50).")
@click.option("--show-program", is_flag=True, help="Print the final program to stderr.")
@click.option("--json", "as_json", is_flag=True, help="Print the whole job result as JSON.")
@click.option(
    "--out",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Write the job's artifacts (files under /workspace/out/) under this folder (made if missing).",
)
def ask(
    question: str,
    tool_modules: tuple[str, ...],
    mcp_config: str | None,
    model: str | None,
    base_url: str | None,
    mode: str,
    options: tuple[str, ...],
    exec_timeout: float | None,
    max_repairs: int | None,
    max_tool_calls: int | None,
    show_program: bool,
    as_json: bool,
    out: Path | None,
) -> None:
    """Answer QUESTION (by default with one model-written program run in a fresh sandbox); print the RESULT payload."""
    from pydantic import ValidationError

    from sandfleet.core.contracts import JobSpec
    from sandfleet.core.settings import get_settings
    from sandfleet.worker.cli.common import tool_specs
    from sandfleet.worker.tools.registry import ToolRegistry

    settings = get_settings()
    code_action = {
        k: v
        for k, v in {
            "exec_timeout": exec_timeout,
            "max_repairs": max_repairs,
            "max_tool_calls": max_tool_calls,
        }.items()
        if v is not None
    }
    try:
        python_tools = ToolRegistry.from_modules(tool_specs(tool_modules, settings))
        spec = JobSpec(
            question=question,
            tools=python_tools.names(),
            model=model,
            mode=mode,
            sandbox=parse_options(options),
            code_action=code_action,
        )
    except ValidationError as e:
        raise click.UsageError(describe_validation_error(e, root="options", sep="\n")) from None
    except SandfleetError as e:
        raise click.ClickException(str(e)) from None
    result, written = _run_here(spec, python_tools, mcp_config, base_url, out)
    _report(result, written, out, show_program=show_program, as_json=as_json)


def _run_here(
    spec: JobSpec, python_tools: ToolRegistry, mcp_config: str | None, base_url: str | None, out: Path | None
) -> tuple[JobResult, list[Path]]:
    """Run the job in this process with one sandbox at most; write its artifacts under ``out``."""
    from sandfleet.core.artifact_files import write_artifacts
    from sandfleet.core.settings import get_settings
    from sandfleet.worker.cli.common import mcp_config_path, mcp_sessions
    from sandfleet.worker.engine import EngineOptions, EngineServices, NullAudit, run_job
    from sandfleet.worker.llm.client import ModelTrust

    settings = get_settings()
    try:
        with (
            mcp_sessions(mcp_config_path(mcp_config, settings), settings) as mcp,
            EngineServices.start(
                settings,
                EngineOptions(
                    registry=python_tools,
                    mcp=mcp,
                    pool_size=0,
                    max_sandboxes=1,
                    job_model_trust=ModelTrust.OPERATOR,  # the model is this command's user's: any file
                ),
            ) as services,
        ):
            # The job may call every tool offered, the MCP servers' included.
            spec = spec.model_copy(update={"tools": services.registry.names()})
            # refuse a missing key before any work
            services.model_client(spec.model or settings.model, base_url, trust=ModelTrust.OPERATOR)
            result = run_job(
                spec,
                f"local-{uuid.uuid4().hex[:12]}",
                services=services,
                audit=NullAudit(),
                base_url=base_url,
            )
            # Written before the services close: the files live in their memory store.
            written = write_artifacts(services.artifacts, result, out) if out is not None else []
    except SandfleetError as e:
        raise click.ClickException(str(e)) from None
    except ValueError as e:  # an artifact name that would lead outside --out
        raise click.ClickException(str(e)) from None
    return result, written


def _report(
    result: JobResult, written: list[Path], out: Path | None, *, show_program: bool, as_json: bool
) -> None:
    """Print the answer (or the whole result as JSON); exit 1 unless the job succeeded."""
    from sandfleet.core.contracts import JobStatus

    if out is not None:
        for s in result.artifacts_skipped:
            echo(f"artifact skipped: {escape_line(s.name)}: {escape_line(s.reason)}", err=True)
        echo(f"{len(written)} artifact file(s) written to {out}", err=True)
    if show_program and result.final_program:
        echo(f"--- program ---\n{escape_program(result.final_program)}--- end ---", err=True)
    if as_json:
        echo_json_text(result.model_dump_json())
    elif result.status == JobStatus.SUCCEEDED:
        text = result.attempts[-1].result_text if result.attempts else None
        if text is None and isinstance(result.result, str):
            text = result.result
        echo_payload(result.result, text)
    if result.status != JobStatus.SUCCEEDED:
        if not as_json:
            echo(
                f"sandfleet ask: {result.status.value}: {result.error.message if result.error else ''}",
                err=True,
            )
        sys.exit(1)
