"""``sandfleet submit | batch | result | jobs``: the producer's commands (``audit`` is in audit.py).

Exit codes: 0 done (the job succeeded), 1 the job ended otherwise or Redis failed, 2 bad input
(nothing enqueued), 3 the job has not ended yet (or did not within --timeout), 4 the final record
is not the one its audit chain proves, or answers a different question than the one submitted (it
is not shown).

Every result shown or exported is verified first (``Client``, ``JobHandle.checked``): with the key
set pinned by ``--keys``/``SANDFLEET_TRUSTED_KEYS``, else with the fleet's key register in Redis.
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

from sandfleet.core.console import echo, echo_json, escape_line
from sandfleet.core.errors import (
    ClientStateError,
    InvalidSpecError,
    JobNotFoundError,
    QueueUnavailableError,
    SigningKeyError,
    UnverifiedResultError,
)
from sandfleet.core.vocabulary import JobStatus
from sandfleet.producer.cli.job_options import job_fields, job_options

if TYPE_CHECKING:  # the client (redis, celery, the pydantic contracts) loads when a command runs,
    # so that `--help` and bad input cost only click
    from sandfleet.core.contracts import JobResult, JobSpec
    from sandfleet.producer.checked import CheckedResult
    from sandfleet.producer.client import Client

EXIT_JOB_FAILED = 1
EXIT_BAD_INPUT = 2
EXIT_NOT_DONE = 3
EXIT_UNVERIFIED = 4
MAX_ERRORS_SHOWN = 20
# CSV cells of these JobSpec fields hold JSON; ``tools`` is comma-separated; the rest are text.
JSON_COLUMNS = ("history", "sandbox", "code_action", "tool_loop", "metadata")


class BadInputError(click.ClickException):
    exit_code = EXIT_BAD_INPUT


@contextmanager
def cli_errors() -> Iterator[None]:
    """Our errors as one-line messages with the exit codes above."""
    try:
        yield
    except InvalidSpecError as e:
        raise BadInputError(f"{e}\nnothing was enqueued") from None
    except (SigningKeyError, ClientStateError) as e:  # a key set, the ledger or the token unusable
        raise BadInputError(str(e)) from None
    except (QueueUnavailableError, JobNotFoundError) as e:
        raise click.ClickException(str(e)) from None


def client_for(keys: Path | None) -> Client:
    """A client that verifies with the key set in ``keys`` when given (else the settings' choice)."""
    from sandfleet.core.settings import get_settings
    from sandfleet.producer.client import Client

    settings = get_settings()
    if keys is not None:
        settings = settings.model_copy(update={"trusted_keys": str(keys)})
    return Client(settings=settings)


keys_option = click.option(
    "--keys",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    default=None,
    help="Verify with this key set only (from `sandfleet keys export`); default: SANDFLEET_TRUSTED_KEYS, "
    "else the keys registered in Redis.",
)


def refuse_unverified(job_id: str, error: UnverifiedResultError, as_json: bool) -> None:
    """Say why a record is not served, and exit 4."""
    if as_json:
        echo_json({"job_id": job_id, "verified": False, "problems": error.problems})
    echo(f"refused: {error}", err=True)
    sys.exit(EXIT_UNVERIFIED)


def payload_text(value: Any) -> str:
    """The RESULT payload as a results file holds it: text as it is, anything else as JSON."""
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)


def show_payload(value: Any) -> None:
    """The RESULT payload on the screen: text keeping its lines, anything else as JSON; escaped."""
    if isinstance(value, str):
        echo(value)
    else:
        echo_json(value)


def show_result(result: JobResult, as_json: bool) -> None:
    """Print a verified final result and exit 0 if it succeeded, else 1 with the error on stderr."""
    if as_json:
        echo_json({**result.model_dump(mode="json"), "verified": True})
    elif result.result is not None:
        show_payload(result.result)
    if result.status != JobStatus.SUCCEEDED:
        error = f": {result.error.kind}: {result.error.message}" if result.error else ""
        echo(f"job {escape_line(result.job_id)} {result.status.value}{error}", err=True)
        sys.exit(EXIT_JOB_FAILED)


# -- submit -----------------------------------------------------------------------------------------
@click.command()
@click.argument("question")
@job_options
@click.option("--batch-id", default=None, help="Add the job to this batch.")
@click.option("--wait", is_flag=True, help="Wait for the job and print its RESULT payload.")
@click.option("--timeout", type=float, default=None, help="Seconds to wait with --wait (default: no limit).")
@click.option("--json", "as_json", is_flag=True, help="Print JSON: {job_id}, or the JobResult with --wait.")
def submit(
    question: str, batch_id: str | None, wait: bool, timeout: float | None, as_json: bool, **options: Any
) -> None:
    """Submit QUESTION to the fleet; print the job id, or with --wait the RESULT payload."""
    fields = job_fields(**options)
    if batch_id:
        fields["batch_id"] = batch_id
    from sandfleet.producer.client import Client

    with cli_errors(), Client() as client:
        job = client.submit(question, **fields)
        if not wait:
            if as_json:
                echo_json({"job_id": job.job_id})
            else:
                echo(job.job_id)
            return
        try:
            result = job.result(timeout=timeout)
        except TimeoutError as e:
            echo(str(e), err=True)
            sys.exit(EXIT_NOT_DONE)
        except UnverifiedResultError as e:
            refuse_unverified(job.job_id, e, as_json)
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
        number, problems = reader.line_num, []
        fields: dict[str, Any] = {}
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


def load_specs(path: Path, defaults: dict[str, Any] | None = None) -> list[tuple[int, JobSpec]]:
    """Every row validated; BadInputError listing each bad row by line number (field and reason).

    ``defaults`` are fields for every row that lacks them (a row's own columns win; sandfleet/producer/defaults.py).
    """
    from sandfleet.producer.client import build_spec
    from sandfleet.producer.defaults import apply_defaults, check_defaults

    try:
        check_defaults(defaults or {})
    except InvalidSpecError as e:
        raise BadInputError(str(e)) from None

    specs, errors = [], []
    for number, row in read_rows(path):
        if isinstance(row, str):
            errors.append(f"line {number}: {row}")
            continue
        try:
            specs.append((number, build_spec(apply_defaults(row, defaults or {}))))
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


def write_results(path: Path, rows: list[tuple[int, str, JobSpec, CheckedResult]]) -> None:
    """Results as JSONL (the whole JobResult per line, and ``verified``) or CSV (line, job_id, question,
    status, verified, result, error). A record its chain does not prove is written with
    ``verified: false`` and the problems, never with its payload."""
    from sandfleet.core.verify import VerdictState

    with path.open("w", newline="", encoding="utf-8") as f:
        if path.suffix.lower() == ".csv":
            writer = csv.writer(f)
            writer.writerow(["line", "job_id", "question", "status", "verified", "result", "error"])
            for number, job_id, spec, checked in rows:
                result = checked.result
                status = result.status.value if result else _row_status(checked)
                value = "" if result is None or result.result is None else payload_text(result.result)
                error = f"{result.error.kind}: {result.error.message}" if result and result.error else ""
                if checked.verdict.state == VerdictState.MISMATCHED:
                    why = (
                        "answers another question"
                        if checked.other_question
                        else "not proven by the audit chain"
                    )
                    error = f"{why}: " + "; ".join(checked.verdict.problems)
                writer.writerow(
                    [number, job_id, spec.question, status, str(checked.verified).lower(), value, error]
                )
            return
        for number, job_id, spec, checked in rows:
            if checked.result is not None:
                data = {**checked.result.model_dump(mode="json"), "verified": True}
            else:
                data = {"job_id": job_id, "status": _row_status(checked), "verified": False}
                if checked.verdict.state == VerdictState.MISMATCHED:
                    data["problems"] = checked.verdict.problems
            f.write(
                json.dumps({"line": number, "question": spec.question, **data}, ensure_ascii=False) + "\n"
            )


def _row_status(checked: CheckedResult) -> str:
    """A row's status when there is no verified result: unfinished, or the state of the verdict."""
    from sandfleet.core.verify import VerdictState

    if checked.verdict.state == VerdictState.UNFINISHED:
        return "unfinished"
    return "unverified" if checked.verdict.state == VerdictState.MISMATCHED else "missing"


@click.command()
@click.argument("file", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@job_options
@click.option(
    "--out",
    type=click.Path(path_type=Path),
    help="Write results (.jsonl or .csv); or a folder: results.jsonl and each job's artifacts in "
    "FOLDER/JOB_ID/. Waits.",
)
@click.option("--wait", is_flag=True, help="Wait for every job, showing progress.")
@click.option("--timeout", type=float, default=None, help="Seconds to wait (default: no limit).")
@click.option("--batch-id", default=None, help="The batch id (default: a new one).")
def batch(
    file: Path, out: Path | None, wait: bool, timeout: float | None, batch_id: str | None, **options: Any
) -> None:
    """Submit every row of FILE (JSONL: a JobSpec per line; CSV: a `question` column) as one batch.

    Every row is validated first: a bad row is reported by line number and nothing is enqueued.
    CSV columns are JobSpec fields: `tools` comma-separated, history/sandbox/code_action/tool_loop/metadata
    as JSON. The job options (--tools, --model, --mode, -o, --exec-timeout, --max-repairs,
    --max-tool-calls, --priority, --metadata) apply to every row; a row's own columns override them
    (sandbox, code_action and metadata key by key). Batch jobs have priority 3 unless set.
    """
    from sandfleet.producer.cli.batch_out import BATCH_RESULTS_NAME, is_folder_target, save_batch_artifacts

    out_dir = out if out is not None and is_folder_target(out) else None
    if out_dir is not None and out_dir.exists() and not out_dir.is_dir():
        raise BadInputError(f"--out {out}: use a .jsonl or a .csv file, or a folder")
    from sandfleet.core.verify import VerdictState
    from sandfleet.producer.client import BatchProgress, Client

    defaults = job_fields(**options)
    rows = load_specs(file, defaults)
    with cli_errors(), Client() as client:
        handle = client.submit_batch([spec for _, spec in rows], batch_id=batch_id)
        echo(escape_line(handle.batch_id))
        echo(f"{len(handle)} jobs enqueued in batch {escape_line(handle.batch_id)}", err=True)
        if not (wait or out):
            return
        try:
            wait_with_bar(handle, timeout)
        except TimeoutError as e:
            echo(str(e), err=True)
        except UnverifiedResultError:
            pass  # reported per row below
        checked = handle.checked_results()
        if out_dir is not None:
            out_dir.mkdir(parents=True, exist_ok=True)
            files = save_batch_artifacts(client, checked, out_dir)
            echo(f"{files} artifact file(s) written under {out_dir}/JOB_ID/", err=True)
            out = out_dir / BATCH_RESULTS_NAME
    if out is not None:
        jobs = zip(rows, handle.job_ids, checked, strict=True)
        write_results(out, [(number, job_id, spec, c) for (number, spec), job_id, c in jobs])
        echo(f"results written to {out}", err=True)
    finished = [c.result for c in checked if c.result is not None]
    counts = {s.value: sum(r.status == s for r in finished) for s in JobStatus}
    echo(str(BatchProgress(total=len(handle), counts=counts)), err=True)
    unverified = [c for c in checked if c.verdict.state == VerdictState.MISMATCHED]
    if other := sum(c.other_question for c in unverified):
        echo(f"{other} result(s) answer a different question than the one submitted (not shown)", err=True)
    if len(unverified) > other:
        echo(f"{len(unverified) - other} result(s) not proven by their audit chains (not shown)", err=True)
    if unverified:
        sys.exit(EXIT_UNVERIFIED)
    if len(finished) < len(checked):
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


# -- result, jobs -----------------------------------------------------------------------------------
@click.command()
@click.argument("job_id")
@click.option("--json", "as_json", is_flag=True, help="Print the whole JobResult as JSON, with `verified`.")
@keys_option
def result(job_id: str, as_json: bool, keys: Path | None) -> None:
    """Print the RESULT payload of a finished job, once its audit chain proves it.

    Exit 3 while the job is still queued or running; exit 4, showing nothing of the record, when the
    record and its audit chain disagree.
    """
    with cli_errors(), client_for(keys) as client:
        handle = client.get(job_id)
        try:
            checked = handle.checked()
        except UnverifiedResultError as e:
            refuse_unverified(job_id, e, as_json)
    if checked.result is None:
        echo(f"job {escape_line(job_id)} is {escape_line(str(checked.verdict.status))}", err=True)
        sys.exit(EXIT_NOT_DONE)
    show_result(checked.result, as_json)


def format_time(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3]


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
        mode = record.spec.mode.value if record.spec else "-"
        if as_json:
            summary = record.model_dump(
                mode="json", include={"job_id", "status", "batch_id", "timestamps", "attempts"}
            )
            extra = {"mode": mode, "priority": record.priority, "deliveries": record.deliveries}
            echo_json({**summary, **extra, "question": question})
        else:
            queued = format_time(record.timestamps["queued"]) if "queued" in record.timestamps else "-"
            line = escape_line(" ".join(question.split())[:60])
            priority = "-" if record.priority is None else str(record.priority)
            echo(
                f"{escape_line(record.job_id)}  {record.status.value:<9}  {mode:<11}  p{priority}  {queued}  {line}"
            )
