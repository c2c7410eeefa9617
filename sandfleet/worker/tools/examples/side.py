"""A tool with a side effect: "sending" mail appends it to ``outbox.jsonl`` in the data folder.

It is marked ``@side_effects``, so the engine knows that repeating a program (a repair) would send the mail
again. ``list_sent_emails`` reads the outbox back, which is how tests count what was sent.
"""

from __future__ import annotations

import datetime as dt
import json
import re
import threading
import uuid

from sandfleet.worker.tools.examples._data import data_dir
from sandfleet.worker.tools.tool import side_effects

__all__ = ["list_sent_emails", "send_email"]

OUTBOX_FILENAME = "outbox.jsonl"
MAX_SUBJECT_CHARS = 200
MAX_BODY_CHARS = 100_000
_ADDRESS = re.compile(r"^[A-Za-z0-9._%+-]{1,64}@[A-Za-z0-9.-]{1,190}\.[A-Za-z]{2,24}$")
_outbox_lock = threading.Lock()


@side_effects
def send_email(to: str, subject: str, body: str = "") -> str:
    """Send an email (recorded in the outbox) and return its message id.

    Validates its arguments, as every tool must: one plain address, a one-line subject, bounded sizes.
    """
    if not isinstance(to, str) or not _ADDRESS.match(to):
        raise ValueError(f"to must be one email address like 'ana@example.com', not {to!r}")
    if not isinstance(subject, str) or "\n" in subject or "\r" in subject or len(subject) > MAX_SUBJECT_CHARS:
        raise ValueError(f"subject must be one line of at most {MAX_SUBJECT_CHARS} characters")
    if not isinstance(body, str) or len(body) > MAX_BODY_CHARS:
        raise ValueError(f"body must be a str of at most {MAX_BODY_CHARS} characters")
    message_id = f"msg-{uuid.uuid4().hex[:12]}"
    record = {
        "id": message_id,
        "to": to,
        "subject": subject,
        "body": body,
        "sent_at": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
    }
    folder = data_dir()
    folder.mkdir(parents=True, exist_ok=True)
    with _outbox_lock, (folder / OUTBOX_FILENAME).open("a", encoding="utf-8") as outbox:
        outbox.write(json.dumps(record) + "\n")
    return message_id


def list_sent_emails() -> list[dict]:
    """Every email sent so far, oldest first: id, to, subject, body, sent_at (ISO time, UTC)."""
    path = data_dir() / OUTBOX_FILENAME
    if not path.exists():
        return []
    with path.open(encoding="utf-8") as outbox:
        return [json.loads(line) for line in outbox if line.strip()]
