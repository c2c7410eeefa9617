"""``sandfleet artifacts JOB [--out DIR]``: the files a job's program handed back.

Without ``--out`` it lists them (name, size, media type, SHA-256, and what was skipped); with it,
it writes them under DIR, each checked against the digest its verified record lists. Exit codes
as the other producer commands: 3 while the job has not ended, 4 when the record or a file is not
the one the audit chain proves (nothing is written then).
"""

from __future__ import annotations

import sys
from pathlib import Path

import click

from sandfleet.core.console import echo, echo_json, escape_line
from sandfleet.core.errors import UnverifiedResultError
from sandfleet.producer.cli.jobs import EXIT_NOT_DONE, cli_errors, client_for, keys_option, refuse_unverified


@click.command()
@click.argument("job_id")
@click.option(
    "--out",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Write the files under this folder (made if missing), each checked against its digest.",
)
@click.option("--json", "as_json", is_flag=True, help="Print the listing (and the paths written) as JSON.")
@keys_option
def artifacts(job_id: str, out: Path | None, as_json: bool, keys: Path | None) -> None:
    """List the files JOB's program wrote under /workspace/out/, or write them under --out DIR."""
    with cli_errors(), client_for(keys) as client:
        handle = client.get(job_id)
        try:
            checked = handle.checked()
            if checked.result is None:
                echo(f"job {escape_line(job_id)} is {checked.verdict.status}: no artifacts yet", err=True)
                sys.exit(EXIT_NOT_DONE)
            result = checked.result
            written = handle.download_artifacts(out) if out is not None else []
        except UnverifiedResultError as e:  # the record, or a file's bytes (ArtifactIntegrityError)
            refuse_unverified(job_id, e, as_json)
        except ValueError as e:  # a name that would lead outside --out
            raise click.ClickException(str(e)) from None
    if as_json:
        data = {
            "job_id": job_id,
            "artifacts": [a.model_dump(mode="json") for a in result.artifacts],
            "skipped": [s.model_dump(mode="json") for s in result.artifacts_skipped],
            "written": [str(p) for p in written],
        }
        echo_json(data)
        return
    # Names and media types come from the program, reasons quote them: one line each, every field.
    for a in result.artifacts:
        echo(f"{escape_line(a.name)}\t{a.size}\t{escape_line(a.media_type)}\t{escape_line(a.sha256)}")
    for s in result.artifacts_skipped:
        echo(f"skipped: {escape_line(s.name)}: {escape_line(s.reason)}", err=True)
    if out is not None:
        echo(f"{len(written)} file(s) written to {out}", err=True)
    elif not result.artifacts:
        echo(f"job {escape_line(job_id)} has no artifacts", err=True)
