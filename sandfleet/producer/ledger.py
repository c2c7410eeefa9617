"""The client's ledger of the jobs it submitted: job id -> SHA-256 of the spec, kept on the user's disk.

A handle checks a result against the spec it submitted (sandfleet/producer/checked.py), but ``sandfleet submit``
and a later ``sandfleet result JOB`` are two processes. So every submit first writes its jobs' spec
digests here, in ``{client_state_dir}/ledger.sqlite3`` (folder 0700, file 0600, nothing in it is
secret), and every later read of a job the ledger holds is checked against it. A job the ledger does
not hold (submitted from another machine, or dropped as old) is checked by its chain only.

Bounded: the newest ``client_ledger_max_jobs`` jobs are kept (default 100,000: 16 MB measured, with
the index), older ones are dropped on the next write. SQLite, because several processes of one user
(a batch running, a ``result`` in another terminal) write and read it at once: its locking makes that
safe, and WAL with ``synchronous=NORMAL`` keeps a submit's write from waiting on the disk (0.26 ms
per single-job submit measured on the shared 2-core host, on a full ledger).
"""

from __future__ import annotations

import os
import sqlite3
import threading
from collections.abc import Iterable
from pathlib import Path

from sandfleet.core.errors import ClientStateError
from sandfleet.core.settings import Settings

LEDGER_NAME = "ledger.sqlite3"
BUSY_TIMEOUT_S = 10.0  # another process of the user writing at the same moment
LOOKUP_CHUNK = 500  # ids per SELECT ... IN (...), below SQLite's limit on bound variables
SCHEMA = """
CREATE TABLE IF NOT EXISTS submitted (
    seq INTEGER PRIMARY KEY,
    job_id TEXT NOT NULL UNIQUE,
    spec_sha256 TEXT NOT NULL
)
"""


def state_folder(settings: Settings) -> Path:
    """The client's state folder (``SANDFLEET_CLIENT_STATE_DIR``, ``~`` expanded)."""
    return Path(settings.client_state_dir).expanduser()


def make_state_folder(folder: Path) -> None:
    """Create the folder (and parents) readable by its owner only; ClientStateError if that fails."""
    try:
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    except OSError as e:
        raise ClientStateError(unusable(folder, e)) from None


def unusable(path: Path, error: BaseException) -> str:
    return (
        f"the client's state at {path} cannot be used ({type(error).__name__}: {error}); set "
        "SANDFLEET_CLIENT_STATE_DIR to a folder of your own that you can write"
    )


class SubmissionLedger:
    """Job id -> submitted spec's SHA-256, for the newest ``max_jobs`` jobs. Thread-safe; the file is
    opened on first use (the constructor only stores)."""

    def __init__(self, path: Path, max_jobs: int) -> None:
        self.path = path
        self.max_jobs = max_jobs
        self._lock = threading.Lock()
        self._db: sqlite3.Connection | None = None

    @classmethod
    def from_settings(cls, settings: Settings) -> SubmissionLedger | None:
        """The user's ledger, or None when it is turned off (``client_ledger_max_jobs`` 0)."""
        if settings.client_ledger_max_jobs <= 0:
            return None
        return cls(state_folder(settings) / LEDGER_NAME, settings.client_ledger_max_jobs)

    def remember(self, jobs: Iterable[tuple[str, str]]) -> None:
        """Note ``(job id, spec sha256)`` pairs, then drop the oldest past ``max_jobs``. Called before
        the jobs are enqueued, so a failure here (ClientStateError) enqueues nothing."""
        rows = list(jobs)
        with self._lock:
            db = self._open(create=True)
            assert db is not None
            try:
                with db:
                    db.executemany(
                        "INSERT OR REPLACE INTO submitted (job_id, spec_sha256) VALUES (?, ?)", rows
                    )
                    db.execute(
                        "DELETE FROM submitted WHERE seq <= (SELECT MAX(seq) FROM submitted) - ?",
                        (self.max_jobs,),
                    )
            except sqlite3.Error as e:
                raise ClientStateError(unusable(self.path, e)) from None

    def spec_digest(self, job_id: str) -> str | None:
        """The SHA-256 of the spec submitted as ``job_id``, or None if the ledger does not hold it."""
        return self.spec_digests([job_id]).get(job_id)

    def spec_digests(self, job_ids: list[str]) -> dict[str, str]:
        """Job id -> submitted spec's SHA-256, for the ids the ledger holds."""
        found: dict[str, str] = {}
        with self._lock:
            db = self._open(create=False)
            if db is None:
                return found
            try:
                for start in range(0, len(job_ids), LOOKUP_CHUNK):
                    chunk = job_ids[start : start + LOOKUP_CHUNK]
                    marks = ",".join("?" * len(chunk))
                    query = f"SELECT job_id, spec_sha256 FROM submitted WHERE job_id IN ({marks})"
                    found.update(db.execute(query, chunk).fetchall())
            except sqlite3.Error as e:
                raise ClientStateError(unusable(self.path, e)) from None
        return found

    def close(self) -> None:
        with self._lock:
            if self._db is not None:
                self._db.close()
                self._db = None

    def _open(self, *, create: bool) -> sqlite3.Connection | None:
        """The connection (made once); None when reading and there is no ledger file yet."""
        if self._db is not None:
            return self._db
        if not create and not self.path.exists():
            return None
        make_state_folder(self.path.parent)
        try:
            if create and not self.path.exists():
                os.close(os.open(self.path, os.O_CREAT | os.O_WRONLY, 0o600))
            db = sqlite3.connect(self.path, timeout=BUSY_TIMEOUT_S, check_same_thread=False)
            db.execute("PRAGMA journal_mode=WAL")
            db.execute("PRAGMA synchronous=NORMAL")
            db.execute(SCHEMA)
        except (OSError, sqlite3.Error) as e:
            raise ClientStateError(unusable(self.path, e)) from None
        self._db = db
        return db
