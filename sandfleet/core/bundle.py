"""Audit bundles: one JSON file with jobs' records, their audit entries and the public keys, checked
offline (``sandfleet audit --verify-file``) with no Redis.

The keys inside a bundle came with it, so they prove only that the bundle is self-consistent; an
auditor who pins the fleet's exported key set (``--keys``) checks it against keys obtained apart from
the bundle. Either way the verdict names the key set it used.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from sandfleet.core.chain import ChainEntry
from sandfleet.core.errors import SigningKeyError
from sandfleet.core.signing import KeyRing
from sandfleet.core.verify import JobEvidence

BUNDLE_FORMAT = "sandfleet-audit-bundle/1"


class BundleError(SigningKeyError):
    """The file is not a readable audit bundle."""


def bundle_data(evidences: list[JobEvidence], ring: KeyRing, fleet: str) -> dict[str, Any]:
    """The bundle as JSON-ready data: jobs (record fields as stored, entries) and the key set."""
    return {
        "format": BUNDLE_FORMAT,
        "fleet": fleet,
        "exported_at": time.time(),
        "keys": ring.export(fleet),
        "jobs": [
            {"job_id": e.job_id, "record": e.record, "entries": [entry.fields() for entry in e.entries]}
            for e in evidences
        ],
    }


def write_bundle(path: Path, evidences: list[JobEvidence], ring: KeyRing, fleet: str) -> None:
    path.write_text(json.dumps(bundle_data(evidences, ring, fleet), ensure_ascii=False) + "\n")


def read_bundle(path: Path) -> tuple[list[JobEvidence], KeyRing]:
    """The jobs and the key set of a bundle; BundleError saying what is wrong with the file."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise BundleError(f"cannot read the bundle {path}: {e}") from e
    if not isinstance(data, dict) or data.get("format") != BUNDLE_FORMAT:
        raise BundleError(f"{path} is not a Sandfleet audit bundle (expected format {BUNDLE_FORMAT!r})")
    try:
        evidences = [
            JobEvidence(
                str(job["job_id"]),
                {str(k): str(v) for k, v in job["record"].items()},
                [ChainEntry.from_fields(e) for e in job["entries"]],
            )
            for job in data["jobs"]
        ]
    except (KeyError, TypeError, AttributeError) as e:
        raise BundleError(f"{path}: a job entry is malformed ({e!r})") from None
    ring = KeyRing.from_export(data.get("keys"), f"the keys inside the bundle {path.name}")
    return evidences, ring
