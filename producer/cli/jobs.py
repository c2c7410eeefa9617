"""``sandfleet submit | batch | result | audit | jobs``: the producer's commands.

Exit codes: 0 done (the job succeeded), 1 the job ended otherwise or Redis failed, 2 bad input
(nothing enqueued), 3 the job has not ended yet (or did not within --timeout).
"""

from __future__ import annotations

import csv
import json
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from sandfleet.core.errors import InvalidSpecError, JobNotFoundError, QueueUnavailableError
from sandfleet.core.options import parse_options, sandbox_option
from sandfleet.core.vocabulary import JobStatus

if TYPE_CHECKING:  # the client (redis, celery, the pydantic contracts) loads when a command runs,
    # so that `--help` and bad input cost only click
    from sandfleet.core.contracts import JobResult, JobSpec

EXIT_JOB_FAILED = 1
EXIT_BAD_INPUT = 2
EXIT_NOT_DONE = 3
MAX_ERRORS_SHOWN = 20
# CSV cells of these JobSpec fields hold JSON; ``tools`` is comma-separated; the rest are text.
JSON_COLUMNS = ("history", "sandbox", "code_action", "metadata")


class BadInputError(click.ClickException):
    exit_code = EXIT_BAD_INPUT


@contextmanager
def cli_errors() -> Iterator[None]:
    """Our errors as one-line messages with the exit codes above."""
    try:
        yield
    except InvalidSpecError as e:
        raise BadInputError(f"{e}\nnothing was enqueued") from None
    except (QueueUnavailableError, JobNotFoundError) as e:
        raise click.ClickException(str(e)) from None


def payload_text(value: Any) -> str:
    """The RESULT payload as printed: text as it is, anything else as JSON."""
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)


def show_result(result: JobResult, as_json: bool) -> None:
    """Print a final result and exit 0 if it succeeded, else 1 with the error on stderr."""
    if as_json:
        click.echo(result.model_dump_json())
    elif result.result is not None:
        click.echo(payload_text(result.result))
    if result.status != JobStatus.SUCCEEDED:
        error = f": {result.error.kind}: {result.error.message}" if result.error else ""
        click.echo(f"job {result.job_id} {result.status.value}{error}", err=True)
        sys.exit(EXIT_JOB_FAILED)


# -- submit -----------------------------------------------------------------------------------------
@click.command()
@click.argument("question")
@click.option("--tools", default="", help="Comma-separated names of the tools the job may call.")
@click.option("--model", default=None, help="provider:model (default: the worker's).")
@sandbox_option
@click.option("--exec-timeout", type=float, default=None, help="Seconds one program may run.")
@click.option("--max-repairs", type=int, default=None, help="Programs rewritten after a failure.")
@click.option("--max-tool-calls", type=int, default=None, help="Tool calls per program run.")
@click.option("--batch-id", default=None, help="Add the job to this batch.")
@click.option("--wait", is_flag=True, help="Wait for the job and print its RESULT payload.")
@click.option("--timeout", type=float, default=None, help="Seconds to wait with --wait (default: no limit).")
@click.option("--json", "as_json", is_flag=True, help="Print JSON: {job_id}, or the JobResult with --wait.")
def submit(
    question: str,
    tools: str,
    model: str | None,
    options: tuple[str, ...],
    exec_timeout: float | None,
    max_repairs: int | None,
    max_tool_calls: int | None,
    batch_id: str | None,
    wait: bool,
    timeout: float | None,
    as_json: bool,
) -> None:
    """Submit QUESTION to the fleet; print the job id, or with --wait the RESULT payload."""
    code_action = {
        k: v
        for k, v in (
            ("exec_timeout", exec_timeout),
            ("max_repairs", max_repairs),
            ("max_tool_calls", max_tool_calls),
        )
        if v is not None
    }
    fields: dict[str, Any] = {"tools": split_list(tools), "sandbox": parse_options(options)}
    if model:
        fields["model"] = model
    if code_action:
        fields["code_action"] = code_action
    if batch_id:
        fields["batch_id"] = batch_id
    from sandfleet.producer.client import Client

    with cli_errors(), Client() as client:
        job = client.submit(question, **fields)
        if not wait:
            click.echo(json.dumps({"job_id": job.job_id}) if as_json else job.job_id)
            return
        try:
            result = job.result(timeout=timeout)
        except TimeoutError as e:
            click.echo(str(e), err=True)
            sys.exit(EXIT_NOT_DONE)
    show_result(result, as_json)


# -- batch ------------------------------------------------------------------------------------------
def split_list(text: str) -> list[str]:
    return [part.strip() for part in text.split(",") if part.strip()]


def read_rows(path: Path) -> Iterator[tuple[int, dict[str, Any] | str]]:
    """``(line number, spec fields)`` per row of a JSONL or CSV file; a string is an error to report."""
    suffix = path.suffix.lower()
    with path.open(newline="", encoding="utf-8") as f:
        if suffix == ".csv":
            yield from _csv_rows(f)
        elif suffix in (".jsonl", ".ndjson", ".json"):
            for number, line in enumerate(f, start=1):
                if not line.strip():
                    continue
                try:
                    row = json.loads(line)
                except json.JSONDecodeError as e:
                    yield number, f"not JSON: {e.msg} (column {e.colno})"
                    continue
                yield (
                    number,
                    row if isinstance(row, dict) else f"expected a JSON object, got {type(row).__name__}",
                )
        else:
            raise BadInputError(f"{path}: use a .jsonl (one JobSpec per line) or a .csv file")


def _csv_rows(f: Any) -> Iterator[tuple[int, dict[str, Any] | str]]:
    reader = csv.DictReader(f)
    if not reader.fieldnames or "question" not in reader.fieldnames:
        raise BadInputError(
            f"the CSV file needs a 'question' column; it has {reader.fieldnames or 'no header'}"
        )
    for row in reader:
        number, fields, problems = reader.line_num, {}, []
        for column, cell in row.items():
            if column is None or cell is None or (cell == "" and column != "question"):
                if column is None:
                    problems.append("more cells than columns")
                continue
            if column == "tools":
                fields[column] = split_list(cell)
            elif column in JSON_COLUMNS:
                try:
                    fields[column] = json.loads(cell)
                except json.JSONDecodeError as e:
                    problems.append(f"{column}: not JSON: {e.msg}")
            else:
                fields[column] = cell
        yield number, "; ".join(problems) if problems else fields


def load_specs(path: Path) -> list[tuple[int, JobSpec]]:
    """Every row validated; BadInputError listing each bad row by line number (field and reason)."""
    from sandfleet.producer.client import build_spec

    specs, errors = [], []
    for number, row in read_rows(path):
        if isinstance(row, str):
            errors.append(f"line {number}: {row}")
            continue
        try:
            specs.append((number, build_spec(row)))
        except InvalidSpecError as e:
            errors.append(f"line {number}: {str(e).removeprefix('invalid job spec: ')}")
    if errors:
        more = [f"... and {len(errors) - MAX_ERRORS_SHOWN} more"] if len(errors) > MAX_ERRORS_SHOWN else []
        raise BadInputError(
            f"{path}: invalid rows, nothing enqueued:\n" + "\n".join(errors[:MAX_ERRORS_SHOWN] + more)
        )
    if not specs:
        raise BadInputError(f"{path}: no jobs in the file")
    return specs


def write_results(path: Path, rows: list[tuple[int, str, JobSpec, JobResult | None]]) -> None:
    """Results as JSONL (the whole JobResult per line) or CSV (line, job_id, question, status, result, error)."""
    with path.open("w", newline="", encoding="utf-8") as f:
        if path.suffix.lower() == ".csv":
            writer = csv.writer(f)
            writer.writerow(["line", "job_id", "question", "status", "result", "error"])
            for number, job_id, spec, result in rows:
                status = result.status.value if result else "unfinished"
                value = "" if result is None or result.result is None else payload_text(result.result)
                error = f"{result.error.kind}: {result.error.message}" if result and result.error else ""
                writer.writerow([number, job_id, spec.question, status, value, error])
            return
        for number, job_id, spec, result in rows:
            data = result.model_dump(mode="json") if result else {"job_id": job_id, "status": "unfinished"}
            f.write(
                json.dumps({"line": number, "question": spec.question, **data}, ensure_ascii=False) + "\n"
            )


@click.command()
@click.argument("file", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option(
    "--out", type=click.Path(dir_okay=False, path_type=Path), help="Write results (.jsonl or .csv); waits."
)
@click.option("--wait", is_flag=True, help="Wait for every job, showing progress.")
@click.option("--timeout", type=float, default=None, help="Seconds to wait (default: no limit).")
@click.option("--batch-id", default=None, help="The batch id (default: a new one).")
def batch(file: Path, out: Path | None, wait: bool, timeout: float | None, batch_id: str | None) -> None:
    """Submit every row of FILE (JSONL: a JobSpec per line; CSV: a `question` column) as one batch.

    Every row is validated first: a bad row is reported by line number and nothing is enqueued.
    CSV columns are JobSpec fields: `tools` comma-separated, history/sandbox/code_action/metadata as JSON.
    """
    if out is not None and out.suffix.lower() not in (".jsonl", ".ndjson", ".json", ".csv"):
        raise BadInputError(f"--out {out}: use a .jsonl or a .csv file")
    from sandfleet.producer.client import BatchProgress, Client

    rows = load_specs(file)
    with cli_errors(), Client() as client:
        handle = client.submit_batch([spec for _, spec in rows], batch_id=batch_id)
        click.echo(handle.batch_id)
        click.echo(f"{len(handle)} jobs enqueued in batch {handle.batch_id}", err=True)
        if not (wait or out):
            return
        try:
            wait_with_bar(handle, timeout)
        except TimeoutError as e:
            click.echo(str(e), err=True)
        results = handle.results()
    if out is not None:
        jobs = zip(rows, handle.job_ids, results, strict=True)
        write_results(out, [(number, job_id, spec, result) for (number, spec), job_id, result in jobs])
        click.echo(f"results written to {out}", err=True)
    finished = [r for r in results if r is not None]
    counts = {s.value: sum(r.status == s for r in finished) for s in JobStatus}
    click.echo(str(BatchProgress(total=len(handle), counts=counts)), err=True)
    if len(finished) < len(results):
        sys.exit(EXIT_NOT_DONE)
    if any(r.status != JobStatus.SUCCEEDED for r in finished):
        sys.exit(EXIT_JOB_FAILED)


def wait_with_bar(handle: Any, timeout: float | None) -> None:
    from sandfleet.producer.client import BatchProgress

    with click.progressbar(length=len(handle), label="jobs", file=sys.stderr, show_pos=True) as bar:
        seen = 0

        def on_progress(progress: BatchProgress) -> None:
            nonlocal seen
            bar.update(progress.done - seen)
            seen = progress.done

        handle.wait(timeout=timeout, on_progress=on_progress)


# -- result, audit, jobs ----------------------------------------------------------------------------
@click.command()
@click.argument("job_id")
@click.option("--json", "as_json", is_flag=True, help="Print the whole JobResult as JSON.")
def result(job_id: str, as_json: bool) -> None:
    """Print the RESULT payload of a finished job (exit 3 while it is still queued or running)."""
    from sandfleet.producer.client import Client

    with cli_errors(), Client() as client:
        record = client.get(job_id).record()
    if record.result is None:
        click.echo(f"job {job_id} is {record.status.value}", err=True)
        sys.exit(EXIT_NOT_DONE)
    show_result(record.result, as_json)


def format_time(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3]


@click.command()
@click.argument("job_id")
@click.option("--json", "as_json", is_flag=True, help="Print JSONL: one AuditEvent per line.")
@click.option("--verify", is_flag=True, help="Check the hash chain; exit 1 if it does not hold.")
def audit(job_id: str, as_json: bool, verify: bool) -> None:
    """Print the job's audit events in order (model calls, programs, runs, tool calls, states)."""
    from sandfleet.producer.client import Client

    with cli_errors(), Client() as client:
        handle = client.get(job_id)
        events = handle.audit()
        verdict = handle.verify_audit() if verify else None
    for event in events:
        if as_json:
            click.echo(event.model_dump_json())
        else:
            data = json.dumps(event.data, ensure_ascii=False, default=str)
            click.echo(f"{format_time(event.ts)}  #{event.attempt}  {event.kind:<12} {data[:300]}")
    if verdict is not None:
        ok, bad = verdict
        message = (
            f"audit chain holds ({len(events)} events)"
            if ok
            else f"audit chain BROKEN at event {bad} of {len(events)}: the record was altered"
        )
        click.echo(message, err=as_json)
        if not ok:
            sys.exit(1)


@click.command()
@click.option("--batch", "batch_id", default=None, help="Only this batch's jobs.")
@click.option(
    "--status", type=click.Choice([s.value for s in JobStatus]), default=None, help="Only jobs in this state."
)
@click.option("--limit", type=click.IntRange(1, 100_000), default=100, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="Print JSONL: one record summary per line.")
def jobs(batch_id: str | None, status: str | None, limit: int, as_json: bool) -> None:
    """List jobs, newest first (a batch's in submission order)."""
    from sandfleet.producer.client import Client

    with cli_errors(), Client() as client:
        records = client.jobs(batch=batch_id, status=status, limit=limit)
    for record in records:
        question = record.spec.question if record.spec else ""
        if as_json:
            summary = record.model_dump(
                mode="json", include={"job_id", "status", "batch_id", "timestamps", "attempts"}
            )
            click.echo(json.dumps({**summary, "deliveries": record.deliveries, "question": question}))
        else:
            queued = format_time(record.timestamps["queued"]) if "queued" in record.timestamps else "-"
            line = " ".join(question.split())
            click.echo(f"{record.job_id}  {record.status.value:<9}  {queued}  {line[:60]}")
