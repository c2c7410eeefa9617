"""Approvers of a test fleet: key pairs made by the real keygen code and the approvers file listing
their public halves (``SANDFLEET_APPROVERS_FILE``).

Decisions must be signed by a listed key: a worker that gates tools but was given no approvers file
refuses every job naming a gated tool, and one given a file its client's key is not in refuses every
decision (a test waits for a decision that never comes, then times out). ``WorkerFactory`` and
``start_worker`` take ``approvers=APPROVERS`` so every gating test worker is started the same way.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from sandfleet.core.approvers import ApproversFile, make_approver_key, public_half_path, read_public_key

APPROVERS = ("ana", "bo")  # the client and the tests' ``sandfleet`` commands sign as the first one


@dataclass
class Approvers:
    """The approvers file of a test fleet and each approver's private key file."""

    file: Path
    keys: dict[str, Path]


def make_approvers(folder: Path, names: tuple[str, ...] = APPROVERS) -> Approvers:
    """Key pairs for ``names`` (as `sandfleet approvers keygen` makes them) listed in an approvers file
    (as `sandfleet approvers add` lists them); made once per folder."""
    listed = ApproversFile(folder / "approvers.json")
    keys = {name: folder / "approvers" / f"{name}.pem" for name in names}
    for name, path in keys.items():
        if not path.exists():
            make_approver_key(path)
            listed.add(name, *read_public_key(public_half_path(path)))
    return Approvers(listed.path, keys)
