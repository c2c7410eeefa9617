"""Approvers: the people whose signed decisions workers accept, and their keys.

An approver's key pair is an Ed25519 pair like a worker's (:mod:`sandfleet.core.signing`: the same
key type, files, key ids and checks). The private key stays on the approver's machine
(``SANDFLEET_APPROVER_KEY``, default ``~/.sandfleet/approver/key.pem``, mode 0600; ``sandfleet
approvers keygen`` makes it, and its public half beside it, ``key.pub.json``). The operator lists the
public keys in the **approvers file** (``SANDFLEET_APPROVERS_FILE``) on each worker host, with
``sandfleet approvers add NAME --key key.pub.json`` / ``list`` / ``revoke NAME``.

Why a file and not Redis: whoever can write Redis could add an approver there, and would then sign
their own decisions. The worker-key register has the same problem, and the same answer: what is
trusted comes from a file the operator controls on the host (``SANDFLEET_TRUSTED_KEYS`` pins
worker keys; this file pins approvers). A worker refuses a file that group or others may write,
re-reads it when it changes (an added or revoked approver counts from the next decision, no
restart), and recomputes every key id from its public key. A revoked entry stays in the file, so a
decision its key signed is refused as revoked, not as unknown.
"""

from __future__ import annotations

import base64
import binascii
import json
import os
import stat
import threading
import time
from pathlib import Path
from typing import Any, Literal

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from sandfleet.core.errors import ApproverKeyError, SigningKeyError
from sandfleet.core.signing import (
    KeyInfo,
    KeyRing,
    KeyStatus,
    WorkerKey,
    key_id_of,
    key_id_problem,
    read_key,
    write_key,
)
from sandfleet.core.validation_text import describe_validation_error

APPROVERS_FORMAT = "sandfleet-approvers/1"
APPROVER_KEY_FORMAT = "sandfleet-approver-key/1"  # the public half, as keygen writes it
APPROVER = "approver"  # the holder name of an approver's WorkerKey (the file names the person)
MAX_APPROVERS_FILE_BYTES = 1024**2
UNSAFE_MODE_BITS = stat.S_IWGRP | stat.S_IWOTH  # the approvers file: nobody but its owner writes it
PRIVATE_MODE_BITS = 0o077  # the private key: nobody but its owner reads it


class ApproverEntry(BaseModel):
    """One approver's public key in the approvers file."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = Field(min_length=1, max_length=200)
    key_id: str
    algorithm: Literal["ed25519"] = "ed25519"
    public_key: str  # base64 of the 32 raw bytes
    added_at: float
    status: Literal["active", "revoked"] = "active"
    revoked_at: float | None = None

    def key_info(self) -> KeyInfo:
        """As a key ring holds it (the ring's ``worker`` is the approver's name)."""
        status = KeyStatus.REVOKED if self.status == "revoked" else KeyStatus.ACTIVE
        info = KeyInfo(
            key_id=self.key_id, worker=self.name, public_key=self.public_key, created_at=self.added_at
        )
        return info.with_status(status) if status == KeyStatus.REVOKED else info


# -- the approver's own key (their machine) -----------------------------------------------------------
def public_half_path(key_path: Path) -> Path:
    """Where keygen writes the public half of ``key_path``: ``key.pem`` -> ``key.pub.json``."""
    return key_path.with_suffix(".pub.json")


def public_key_json(key: WorkerKey) -> dict[str, Any]:
    """The public half the approver gives the operator (``approvers add NAME --key FILE``)."""
    return {
        "format": APPROVER_KEY_FORMAT,
        "key_id": key.key_id,
        "algorithm": "ed25519",
        "public_key": key.info.public_key,
    }


def make_approver_key(path: str | Path) -> WorkerKey:
    """A new key pair: the private key written to ``path`` (0600, folder 0700), the public half beside it.

    Raises:
        ApproverKeyError: ``path`` exists already (a key is never overwritten), or cannot be written.
    """
    key_path = Path(path).expanduser()
    if key_path.exists():
        raise ApproverKeyError(
            f"{key_path} exists already: an approver key is never overwritten (its decisions would no "
            "longer verify); name another file with --key, or remove this one yourself"
        )
    key = WorkerKey.generate(APPROVER)
    try:
        write_key(key_path, key)
        public_half_path(key_path).write_text(json.dumps(public_key_json(key), indent=2) + "\n")
    except (SigningKeyError, OSError) as e:
        raise ApproverKeyError(f"cannot write the approver key {key_path}: {e}") from e
    return key


def load_approver_key(path: str | Path) -> WorkerKey:
    """The approver's private key in ``path``, refused when others may read it.

    Raises:
        ApproverKeyError: missing, unreadable, not an Ed25519 key, or readable by group or others.
    """
    key_path = Path(path).expanduser()
    try:
        mode = key_path.stat().st_mode
    except FileNotFoundError:
        raise ApproverKeyError(
            f"no approver key at {key_path}: make one with `sandfleet approvers keygen`, and have the "
            "operator add its public half to the workers' approvers file (`sandfleet approvers add`)"
        ) from None
    except OSError as e:
        raise ApproverKeyError(f"cannot read the approver key {key_path}: {e}") from e
    if mode & PRIVATE_MODE_BITS:
        raise ApproverKeyError(
            f"the approver key {key_path} is readable by others (mode {stat.S_IMODE(mode):04o}): whoever "
            f"reads it can sign your decisions; chmod 600 {key_path}, or make a new key if it was exposed"
        )
    try:
        return read_key(key_path, APPROVER)
    except SigningKeyError as e:
        raise ApproverKeyError(str(e)) from e


def read_public_key(path: str | Path) -> tuple[str, str]:
    """``(key id, base64 public key)`` from a public-key file: keygen's JSON or a PEM public key.

    Raises:
        ApproverKeyError: unreadable, not an Ed25519 public key, or a key id that is not its key's.
    """
    key_path = Path(path).expanduser()
    try:
        raw = key_path.read_bytes()[: MAX_APPROVERS_FILE_BYTES + 1]
    except OSError as e:
        raise ApproverKeyError(f"cannot read the public key {key_path}: {e}") from e
    try:
        if raw.lstrip().startswith(b"{"):
            data = json.loads(raw)
            if not isinstance(data, dict) or data.get("format") != APPROVER_KEY_FORMAT:
                raise ValueError(f"not an approver's public key (format {APPROVER_KEY_FORMAT!r})")
            public = Ed25519PublicKey.from_public_bytes(base64.b64decode(data["public_key"], validate=True))
            claimed = data.get("key_id")
        else:
            loaded = serialization.load_pem_public_key(raw)
            if not isinstance(loaded, Ed25519PublicKey):
                raise ValueError(f"a {type(loaded).__name__}, not an Ed25519 public key")
            public, claimed = loaded, None
    except (ValueError, KeyError, TypeError, binascii.Error) as e:
        raise ApproverKeyError(f"{key_path} is not an approver's public key: {e}") from None
    key_id = key_id_of(public)
    if claimed is not None and claimed != key_id:
        raise ApproverKeyError(
            f"{key_path} names key id {claimed}, but its public key's id is {key_id}: the file was edited"
        )
    encoded = public.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return key_id, base64.b64encode(encoded).decode()


# -- the approvers file (each worker host; the operator's) --------------------------------------------
class ApproversFile:
    """The operator's list of approvers in one JSON file, read again whenever it changes. Thread-safe."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path).expanduser()
        self._lock = threading.Lock()
        self._stamp: tuple[int, int, int] | None = None
        self._entries: list[ApproverEntry] = []
        self._ring: KeyRing | None = None

    @property
    def source(self) -> str:
        return f"the approvers file {self.path}"

    def entries(self) -> list[ApproverEntry]:
        """Every entry, revoked ones too, in the file's order.

        Raises:
            ApproverKeyError: missing, unreadable, writable by group or others, malformed, or an entry
                whose key id is not its public key's.
        """
        with self._lock:
            self._reload()
            return list(self._entries)

    def ring(self) -> KeyRing:
        """The approvers' keys as a key ring (key id -> entry; revoked ones marked so). Raises as entries."""
        with self._lock:
            self._reload()
            if self._ring is None:  # _reload reads the file or raises; said again so python -O keeps it
                raise ApproverKeyError(f"{self.source} was not read")
            return self._ring

    def _reload(self) -> None:  # holds _lock
        try:
            st = self.path.stat()
        except FileNotFoundError:
            raise ApproverKeyError(
                f"{self.source} does not exist: add an approver with `sandfleet approvers add NAME --key "
                "FILE` (it makes the file)"
            ) from None
        except OSError as e:
            raise ApproverKeyError(f"cannot read {self.source}: {e}") from e
        if st.st_mode & UNSAFE_MODE_BITS:
            raise ApproverKeyError(
                f"{self.source} is writable by group or others (mode {stat.S_IMODE(st.st_mode):04o}): "
                f"whoever can write it can add an approver; chmod go-w {self.path}"
            )
        folder = self.path.parent.stat().st_mode
        if folder & stat.S_IWOTH and not folder & stat.S_ISVTX:
            raise ApproverKeyError(
                f"{self.source} is in a folder anyone may write (mode {stat.S_IMODE(folder):04o}): "
                "whoever can write there can put another file in its place; move it"
            )
        stamp = (st.st_ino, st.st_mtime_ns, st.st_size)
        if stamp == self._stamp and self._ring is not None:
            return
        entries = _parse(self.path, self.source)
        self._entries, self._stamp = entries, stamp
        self._ring = KeyRing([e.key_info() for e in entries], self.source)

    # -- editing (`sandfleet approvers add/revoke`, on the worker host) ----------------------------
    def add(self, name: str, key_id: str, public_key: str) -> ApproverEntry:
        """Add ``name`` with this public key; the file is made (mode 0644) if missing.

        Raises:
            ApproverKeyError: the key is listed already (or was revoked: a revoked key never comes
                back), or ``name`` has an active key already (revoke it first).
        """
        entries = self.entries() if self.path.exists() else []
        for entry in entries:
            if entry.key_id == key_id:
                state = "revoked" if entry.status == "revoked" else "listed"
                raise ApproverKeyError(f"key {key_id} is {state} already in {self.source} (as {entry.name})")
            if entry.name == name and entry.status == "active":
                raise ApproverKeyError(
                    f"{name} has an active key ({entry.key_id}) in {self.source}: revoke it first "
                    f"(`sandfleet approvers revoke {entry.key_id}`)"
                )
        entry = ApproverEntry(name=name, key_id=key_id, public_key=public_key, added_at=time.time())
        if problem := key_id_problem(entry.key_info()):
            raise ApproverKeyError(f"not added: {problem}")
        self._write([*entries, entry])
        return entry

    def revoke(self, name_or_key_id: str) -> list[ApproverEntry]:
        """Revoke the active keys of an approver (by name) or one key (by id): decisions they signed are
        refused from then on. Returns the entries revoked.

        Raises:
            ApproverKeyError: no active key of that name or id.
        """
        entries, revoked, now = self.entries(), [], time.time()
        kept = []
        for entry in entries:
            if entry.status == "active" and name_or_key_id in (entry.name, entry.key_id):
                entry = entry.model_copy(update={"status": "revoked", "revoked_at": now})
                revoked.append(entry)
            kept.append(entry)
        if not revoked:
            raise ApproverKeyError(f"no active approver or key {name_or_key_id!r} in {self.source}")
        self._write(kept)
        return revoked

    def _write(self, entries: list[ApproverEntry]) -> None:
        """The whole file, atomically (a worker reads the old list or the new one, never half)."""
        body = {"format": APPROVERS_FORMAT, "approvers": [e.model_dump(mode="json") for e in entries]}
        tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            with os.fdopen(fd, "w") as f:
                f.write(json.dumps(body, indent=2) + "\n")
                f.flush()
                os.fsync(f.fileno())
            os.chmod(tmp, 0o644)  # whatever the umask: readable, written by its owner only
            os.replace(tmp, self.path)
        except OSError as e:
            raise ApproverKeyError(f"cannot write {self.source}: {e}") from e


def _parse(path: Path, source: str) -> list[ApproverEntry]:
    """The entries of the file at ``path``, all or nothing."""
    try:
        raw = path.read_bytes()
    except OSError as e:
        raise ApproverKeyError(f"cannot read {source}: {e}") from e
    if len(raw) > MAX_APPROVERS_FILE_BYTES:
        raise ApproverKeyError(f"{source} is larger than {MAX_APPROVERS_FILE_BYTES} bytes")
    try:
        data = json.loads(raw)
    except ValueError as e:
        raise ApproverKeyError(f"{source} is not JSON: {e}") from None
    if not isinstance(data, dict) or data.get("format") != APPROVERS_FORMAT:
        raise ApproverKeyError(f"{source} is not an approvers file (expected format {APPROVERS_FORMAT!r})")
    try:
        entries = [ApproverEntry.model_validate(e) for e in data.get("approvers", [])]
    except ValidationError as e:
        raise ApproverKeyError(f"{source}: invalid entry: {describe_validation_error(e, 'entry')}") from None
    problems = [p for p in (key_id_problem(e.key_info()) for e in entries) if p is not None]
    if problems:  # a file is all or nothing, like a pinned key set
        raise ApproverKeyError(f"{source}: refused: " + "; ".join(problems))
    return entries
