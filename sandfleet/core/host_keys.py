"""The public keys of the signing keys made on this worker host: what a worker with no pinned key set
trusts before it acts on state read back from Redis.

A worker resumes a suspended job's checkpoint, serves an approved call's stored outcome and sends a
committed webhook only when the job's audit chain is signed with keys it trusts. The key register in
Redis cannot be that trust: whoever writes Redis can add a key of its own and sign a planted
checkpoint with it. So a worker trusts the pinned key set (``SANDFLEET_TRUSTED_KEYS``) when it has
one, and otherwise the keys made in its own state folder: ``{worker_state_dir}/keys/public/
{key_id}.json``, written when a key is made, loaded or rotated there (never from Redis). The workers
sharing that folder are one host's, run by one user who can read each other's private keys anyway, so
trusting them adds no one; and a worker restarted under another name (a new key) still resumes what
its earlier self suspended. A retired key stays listed (what it signed still verifies); a revoked one
is removed, and revocations registered in Redis apply on top.

What this does not cover is a fleet spread over hosts: a job suspended on one host and resumed on
another, or a webhook a dead host committed, is refused (``untrusted_state``) until the operator pins
the fleet's key set, and the refusal says so. That is the price of not trusting Redis; a single host,
``sandfleet worker`` on a laptop, LocalFleet and compose (one state volume) need nothing.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

from pydantic import ValidationError

from sandfleet.core.errors import SigningKeyError
from sandfleet.core.signing import KeyInfo, KeyRing, key_id_problem

log = logging.getLogger(__name__)

PUBLIC_KEYS_SUBDIR = ("keys", "public")
PUBLIC_KEY_FILE_MODE = 0o644  # public halves: readable, written only by the host's worker user
PIN_HINT = (
    "pin the fleet's key set with SANDFLEET_TRUSTED_KEYS (`sandfleet keys export`) to trust other hosts"
)


def host_keys_dir(state_dir: str | Path) -> Path:
    """``{state_dir}/keys/public``: one ``{key_id}.json`` (a KeyInfo) per key made on this host."""
    return Path(state_dir).expanduser().joinpath(*PUBLIC_KEYS_SUBDIR)


def remember_host_key(state_dir: str | Path, info: KeyInfo) -> None:
    """Add ``info`` to this host's key set (atomically; rewriting an entry only updates its status).

    Raises:
        SigningKeyError: the folder cannot be written, or ``info``'s key id is not its public key's.
    """
    if problem := key_id_problem(info):
        raise SigningKeyError(f"not added to this host's keys: {problem}")
    folder = host_keys_dir(state_dir)
    path = folder / f"{info.key_id}.json"
    try:
        folder.mkdir(parents=True, exist_ok=True, mode=0o700)
        tmp = folder / f".{info.key_id}.{os.getpid()}.tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, PUBLIC_KEY_FILE_MODE)
        with os.fdopen(fd, "w") as f:
            f.write(info.model_dump_json())
        os.replace(tmp, path)
    except OSError as e:
        raise SigningKeyError(f"cannot write this host's public key {path}: {e}") from e


def forget_host_key(state_dir: str | Path, key_id: str) -> None:
    """Drop ``key_id`` from this host's key set (it was revoked: what it signed proves nothing)."""
    (host_keys_dir(state_dir) / f"{key_id}.json").unlink(missing_ok=True)


def host_ring(state_dir: str | Path) -> KeyRing:
    """The keys made on this host, as a ring (an unreadable or malformed file is left out and logged:
    leaving a key out can only refuse, never trust)."""
    folder = host_keys_dir(state_dir)
    infos: list[KeyInfo] = []
    try:
        paths = sorted(folder.glob("*.json"))
    except OSError as e:  # pragma: no cover - glob swallows most errors
        log.warning("cannot list this host's public keys in %s: %s", folder, e)
        paths = []
    for path in paths:
        try:
            info = KeyInfo.model_validate_json(path.read_bytes())
        except (OSError, ValidationError) as e:
            log.warning("this host's public key file %s is not used: %s", path, e)
            continue
        if info.key_id != path.stem:
            log.warning("this host's public key file %s holds key %s: not used", path, info.key_id)
            continue
        infos.append(info)
    return KeyRing(infos, f"this host's keys in {folder}; {PIN_HINT}")
