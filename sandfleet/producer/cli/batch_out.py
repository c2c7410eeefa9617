"""``sandfleet batch FILE --out DIR``: a folder for a batch's results and every job's artifacts.

``--out`` naming a .jsonl/.csv file writes the results there, as before; anything else is a folder:
``DIR/results.jsonl`` and each job's files under ``DIR/JOB_ID/`` (sandfleet.producer.artifacts).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from sandfleet.core.console import echo, escape_line
from sandfleet.core.errors import UnverifiedResultError

if TYPE_CHECKING:
    from sandfleet.producer.checked import CheckedResult
    from sandfleet.producer.client import Client

RESULT_SUFFIXES = (".jsonl", ".ndjson", ".json", ".csv")
BATCH_RESULTS_NAME = "results.jsonl"


def is_folder_target(path: Path) -> bool:
    """Whether ``batch --out PATH`` names a folder (results.jsonl and every job's artifacts go there)
    rather than a results file (.jsonl or .csv)."""
    return path.is_dir() or path.suffix.lower() not in RESULT_SUFFIXES


def save_batch_artifacts(client: Client, checked: list[CheckedResult], folder: Path) -> int:
    """Write each verified job's artifacts under ``folder/JOB_ID/``; how many files were written.
    A job whose files are gone or changed is reported and skipped (its files are not written)."""
    from sandfleet.producer.artifacts import write_artifacts

    count = 0
    for c in checked:
        if c.result is None or not c.result.artifacts:
            continue
        try:
            count += len(write_artifacts(client.artifact_store, c.result, folder / c.job_id))
        except (UnverifiedResultError, ValueError) as e:
            echo(f"{escape_line(c.job_id)}: artifacts not written: {e}", err=True)
    return count
