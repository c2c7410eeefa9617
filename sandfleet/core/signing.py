"""Ed25519 key pairs of workers, through the ``cryptography`` package (its errors are translated here).

Each worker holds its own private key in a file on its host (``{worker_state_dir}/keys/{worker}.pem``,
PKCS#8, mode 0600) and signs every audit entry it writes (:func:`sandfleet.core.chain.signed_message`).
Only public keys leave the host: registered in Redis (:mod:`sandfleet.core.key_registry`) and
exported as a JSON key set, so an auditor checks signatures without the power to make them.

Signing costs ~45 us and checking ~130 us per entry on this host (2 cores; measured with
cryptography 50): a few thousand entries per second per core.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import logging
import os
import re
import threading
import time
from enum import StrEnum
from pathlib import Path
from typing import Any, Literal, Protocol

from cryptography.exceptions import InvalidSignature, UnsupportedAlgorithm
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from pydantic import BaseModel, ConfigDict, ValidationError

from sandfleet.core.errors import SigningKeyError
from sandfleet.core.validation_text import describe_validation_error

log = logging.getLogger(__name__)

KEY_SET_FORMAT = "sandfleet-keys/1"
KEY_ID_HEX_CHARS = 32  # 128 bits of the public key's SHA-256
KEY_FILE_MODE = 0o600
_UNSAFE_NAME = re.compile(r"[^A-Za-z0-9_.@:-]")


class KeyStatus(StrEnum):
    """A registered key's state. Retired keys still prove what they signed; revoked keys prove nothing."""

    ACTIVE = "active"
    RETIRED = "retired"  # rotated out: entries it signed before still verify
    REVOKED = "revoked"  # compromised: every entry it signed is refused


class KeyInfo(BaseModel):
    """A worker's public key as registered and exported."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    key_id: str
    worker: str
    algorithm: Literal["ed25519"] = "ed25519"
    public_key: str  # base64 of the 32 raw bytes
    created_at: float
    status: KeyStatus = KeyStatus.ACTIVE
    changed_at: float | None = None

    def with_status(self, status: KeyStatus) -> KeyInfo:
        return self.model_copy(update={"status": status, "changed_at": time.time()})


def key_id_of(public: Ed25519PublicKey) -> str:
    raw = public.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return hashlib.sha256(raw).hexdigest()[:KEY_ID_HEX_CHARS]


def key_id_problem(info: KeyInfo) -> str | None:
    """Why ``info`` must not be used: its key id is not the hash of its public key (or it holds no
    Ed25519 public key); None when it is. Recomputed wherever a key set is built, never trusted as
    stored: whoever writes Redis could otherwise put their own public key under a genuine key id."""
    try:
        public = Ed25519PublicKey.from_public_bytes(base64.b64decode(info.public_key, validate=True))
    except (ValueError, binascii.Error):
        return f"key {info.key_id} of worker {info.worker}: its public key is not a base64 Ed25519 key"
    actual = key_id_of(public)
    if actual != info.key_id:
        return (
            f"key id {info.key_id} (worker {info.worker}) is not the hash of its public key (that key's id "
            f"is {actual}): the entry was replaced by someone who could write it"
        )
    return None


class WorkerKey:
    """One worker's private key and the public half it registers."""

    def __init__(self, private: Ed25519PrivateKey, worker: str, created_at: float | None = None) -> None:
        self._private = private
        self.worker = worker
        public = private.public_key()
        raw = public.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
        self.info = KeyInfo(
            key_id=key_id_of(public),
            worker=worker,
            public_key=base64.b64encode(raw).decode(),
            created_at=created_at if created_at is not None else time.time(),
        )

    @property
    def key_id(self) -> str:
        return self.info.key_id

    @classmethod
    def generate(cls, worker: str) -> WorkerKey:
        return cls(Ed25519PrivateKey.generate(), worker)

    def sign(self, message: bytes) -> str:
        """Base64 of the Ed25519 signature of ``message``."""
        return base64.b64encode(self._private.sign(message)).decode()

    def pem(self) -> bytes:
        return self._private.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )


class ChainSigner(Protocol):
    """What writes a worker's audit entries: its name, and ``sign(message) -> (signature, key id)``."""

    worker: str

    def sign(self, message: bytes) -> tuple[str, str]: ...

    def key_info(self) -> KeyInfo:
        """The public half of the key it signs with now (registered with what it writes)."""
        ...


# -- key files on the worker host -------------------------------------------------------------------
def key_path(state_dir: str | Path, worker: str) -> Path:
    """Where ``worker``'s private key lives: ``{state_dir}/keys/{worker}.pem`` (unsafe characters -> _)."""
    return Path(state_dir).expanduser() / "keys" / f"{_UNSAFE_NAME.sub('_', worker) or 'worker'}.pem"


def read_key(path: Path, worker: str) -> WorkerKey:
    """The key in ``path``; SigningKeyError if it cannot be read or is not an Ed25519 private key."""
    try:
        private = serialization.load_pem_private_key(path.read_bytes(), password=None)
        created = path.stat().st_mtime
    except (OSError, ValueError, TypeError, UnsupportedAlgorithm) as e:
        raise SigningKeyError(f"cannot read the signing key {path}: {e}") from e
    if not isinstance(private, Ed25519PrivateKey):
        raise SigningKeyError(f"{path} holds a {type(private).__name__}, not an Ed25519 private key")
    return WorkerKey(private, worker, created_at=created)


def write_key(path: Path, key: WorkerKey) -> None:
    """Write ``key`` to ``path`` (mode 0600, folder 0700) atomically: a reader sees the old or the new."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, KEY_FILE_MODE)
        with os.fdopen(fd, "wb") as f:
            f.write(key.pem())
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as e:
        raise SigningKeyError(f"cannot write the signing key {path}: {e}") from e


def load_or_create_key(path: Path, worker: str) -> tuple[WorkerKey, bool]:
    """``(key, created)``: the key in ``path``, or a new one written there."""
    if path.exists():
        return read_key(path, worker), False
    key = WorkerKey.generate(worker)
    write_key(path, key)
    log.warning("made a new signing key %s for worker %s in %s", key.key_id, worker, path)
    return key, True


class FileSigner:
    """Signs with the key in one file, re-read when the file changes (a rotation needs no restart).

    One ``os.stat`` per signature (~2 us) is the price of noticing a rotation at once.
    """

    def __init__(self, path: Path, worker: str) -> None:
        self.path = path
        self.worker = worker
        self._lock = threading.Lock()
        self._key, _created = load_or_create_key(path, worker)
        self._stamp = self._file_stamp()

    @property
    def key(self) -> WorkerKey:
        with self._lock:
            self._reload_if_changed()
            return self._key

    def sign(self, message: bytes) -> tuple[str, str]:
        """``(signature, key id)`` of ``message`` with the file's current key."""
        key = self.key
        return key.sign(message), key.key_id

    def key_info(self) -> KeyInfo:
        return self.key.info

    def _file_stamp(self) -> tuple[int, int, int]:
        st = self.path.stat()
        return st.st_ino, st.st_mtime_ns, st.st_size

    def _reload_if_changed(self) -> None:  # holds _lock
        try:
            stamp = self._file_stamp()
        except OSError as e:
            raise SigningKeyError(f"the signing key {self.path} is gone: {e}") from e
        if stamp != self._stamp:
            self._key, self._stamp = read_key(self.path, self.worker), stamp
            log.warning(
                "worker %s now signs with key %s (the key file changed)", self.worker, self._key.key_id
            )


# -- public keys: checking signatures ---------------------------------------------------------------
class KeyRing:
    """Public keys by key id, for checking signatures; ``source`` says where they came from.

    An entry whose key id is not the hash of its public key is never used: it is kept in ``rejected``
    (key id -> why), and a signature naming that key id is refused saying so.
    """

    def __init__(self, infos: list[KeyInfo], source: str, rejected: dict[str, str] | None = None) -> None:
        self.rejected = dict(rejected or {})
        self.infos: dict[str, KeyInfo] = {}
        for info in infos:
            problem = key_id_problem(info)
            if problem is None:
                self.infos[info.key_id] = info
            else:
                self.rejected[info.key_id] = problem
        self.source = source
        self._public: dict[str, Ed25519PublicKey] = {}

    def __contains__(self, key_id: str) -> bool:
        return key_id in self.infos

    def get(self, key_id: str) -> KeyInfo | None:
        return self.infos.get(key_id)

    def check(self, key_id: str, message: bytes, signature: str) -> str | None:
        """None when ``signature`` is ``key_id``'s valid signature of ``message``; else why not."""
        info = self.infos.get(key_id)
        if key_id in self.rejected:
            return f"signed with key {key_id}, whose registered entry is not used: {self.rejected[key_id]}"
        if info is None:
            return f"signed with key {key_id or '(none)'}, which is not in the key set ({self.source})"
        if info.status == KeyStatus.REVOKED:
            return f"signed with key {key_id} of worker {info.worker}, which is revoked"
        public = self._public.get(key_id)
        try:
            if public is None:
                public = Ed25519PublicKey.from_public_bytes(base64.b64decode(info.public_key))
                self._public[key_id] = public
            public.verify(base64.b64decode(signature, validate=True), message)
        except (InvalidSignature, ValueError, binascii.Error):
            return f"the signature does not verify with key {key_id} of worker {info.worker}"
        return None

    def with_revocations(self, others: list[KeyInfo]) -> KeyRing:
        """This ring with every key that ``others`` marks revoked revoked here too (never adds keys:
        a revocation from an untrusted source can only make verification stricter)."""
        revoked = {i.key_id for i in others if i.status == KeyStatus.REVOKED}
        infos = [i.with_status(KeyStatus.REVOKED) if i.key_id in revoked else i for i in self.infos.values()]
        return KeyRing(infos, self.source, self.rejected)

    def with_own(self, own: KeyInfo) -> KeyRing:
        """This ring with ``own`` (the public half of the private key a worker holds): a worker needs no
        register to know its own key, and no register entry can replace it. A revocation of it stays
        (a revoked key may have been stolen: what it signed proves nothing, to its worker neither)."""
        known = self.infos.get(own.key_id)
        if known is not None and known.status == KeyStatus.REVOKED:
            own = own.with_status(KeyStatus.REVOKED)
        infos = [i for i in self.infos.values() if i.key_id != own.key_id] + [own]
        rejected = {k: why for k, why in self.rejected.items() if k != own.key_id}
        return KeyRing(infos, f"{self.source} and this worker's own key", rejected)

    # -- the exported key set ---------------------------------------------------------------------
    def export(self, fleet: str) -> dict[str, Any]:
        """The JSON key set ``sandfleet keys export`` writes."""
        return {
            "format": KEY_SET_FORMAT,
            "fleet": fleet,
            "exported_at": time.time(),
            "keys": [
                i.model_dump(mode="json") for i in sorted(self.infos.values(), key=lambda i: i.created_at)
            ],
        }

    @classmethod
    def from_export(cls, data: Any, source: str) -> KeyRing:
        """A ring from an exported key set; SigningKeyError naming what is wrong with it."""
        if not isinstance(data, dict) or data.get("format") != KEY_SET_FORMAT:
            raise SigningKeyError(f"{source}: not a Sandfleet key set (expected format {KEY_SET_FORMAT!r})")
        try:
            infos = [KeyInfo.model_validate(k) for k in data.get("keys", [])]
        except ValidationError as e:
            raise SigningKeyError(
                f"{source}: invalid key entry: {describe_validation_error(e, 'entry')}"
            ) from None
        if problems := [p for p in map(key_id_problem, infos) if p is not None]:  # a file is all or nothing
            raise SigningKeyError(f"{source}: refused: " + "; ".join(problems))
        return cls(infos, source)
