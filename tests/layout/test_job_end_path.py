"""Every final record a worker writes goes through the job-end hooks (sandfleet/worker/delivery/job_end.py).

The store's ``finish`` is the raw write; a second final write on the store (an error-only
``finish_with_error``) let callers end a job without the hooks, so the metrics, the webhooks and the
cancel cleanup missed error endings. No module outside ``job_end.py`` may call ``.finish(`` on a store.
"""

from __future__ import annotations

import re
from pathlib import Path

from sandfleet.core.store import JobStore

ROOT = Path(__file__).resolve().parents[2] / "sandfleet"


def test_the_store_has_no_final_write_that_skips_the_job_end_hooks() -> None:
    assert not hasattr(JobStore, "finish_with_error")


def test_only_the_job_end_path_writes_final_records() -> None:
    writers = [
        str(path.relative_to(ROOT))
        for path in ROOT.rglob("*.py")
        if re.search(r"\bstore\.finish(_with_error)?\(", path.read_text())
    ]
    assert writers == ["worker/delivery/job_end.py"]
