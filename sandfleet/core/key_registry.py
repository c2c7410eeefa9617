"""The fleet's register of workers' public keys in Redis, and the key's life on a worker host:
made and registered when the worker starts, rotated, revoked.

Anyone who can write to Redis can also add a key here, so the register is where keys are *found*,
not why they are *trusted*: an auditor pins an exported key set (``sandfleet keys export``, then
``SANDFLEET_TRUSTED_KEYS`` or ``--keys``), and only revocations are taken from Redis on top of it
(a revocation can only make verification stricter). Workers honour the same setting when they verify
a job's chain before using state it commits to (:func:`worker_ring`); without it they trust the keys
made on their own host (sandfleet/core/host_keys.py), never the register. A key id is the hash of its
public key, recomputed every time the register is read: an entry holding another public key under a
genuine id is reported (``rejected``) and never used. SECURITY.md has the threat model.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path

import redis
from pydantic import ValidationError

from sandfleet.core.errors import SigningKeyError
from sandfleet.core.host_keys import forget_host_key, host_ring, remember_host_key
from sandfleet.core.redis_keys import FleetKeys
from sandfleet.core.replies import text_map
from sandfleet.core.settings import Settings
from sandfleet.core.signing import (
    FileSigner,
    KeyInfo,
    KeyRing,
    KeyStatus,
    WorkerKey,
    key_id_problem,
    key_path,
    load_or_create_key,
    read_key,
    write_key,
)

log = logging.getLogger(__name__)
UNPINNED_SOURCE = "the fleet's key register in Redis (not pinned)"


@dataclass(frozen=True)
class RegisterContents:
    """The register as read: the keys that may be used, and the entries that may not (field -> why:
    not a key entry, or a key id that is not the hash of its public key)."""

    keys: list[KeyInfo]
    rejected: dict[str, str] = field(default_factory=dict)


class KeyRegistry:
    """Public keys by key id in one Redis hash. A key id, once registered, keeps its worker."""

    def __init__(self, client: redis.Redis, keys: FleetKeys) -> None:
        self._redis = client
        self._key = keys.signing_keys

    @property
    def name(self) -> str:
        """The register's Redis key (a hash: key id -> KeyInfo JSON)."""
        return self._key

    def register(self, info: KeyInfo) -> KeyInfo:
        """Add ``info`` unless its key id is there already; returns what is registered for it (as
        stored: the caller compares it with its own key).

        Raises:
            SigningKeyError: ``info``'s key id is not the hash of its public key.
        """
        if problem := key_id_problem(info):
            raise SigningKeyError(f"not registered: {problem}")
        self._redis.hsetnx(self._key, info.key_id, info.model_dump_json())
        stored = self.get(info.key_id)
        if stored is None:  # just written, and keys of the register never expire: Redis lost it
            raise SigningKeyError(f"key {info.key_id} is not in the register right after it was written")
        return stored

    def get(self, key_id: str) -> KeyInfo | None:
        """The entry as stored (its key id NOT checked: see :func:`key_id_problem`); None if absent.

        Raises:
            SigningKeyError: the entry is not a key entry.
        """
        raw = self._redis.hget(self._key, key_id)
        if not raw:
            return None
        try:
            return KeyInfo.model_validate_json(raw)
        except ValidationError:
            raise SigningKeyError(f"the key register's entry {key_id!r} is not a key entry") from None

    def contents(self) -> RegisterContents:
        """Every entry, checked: the usable keys oldest first, and the rejected entries (why each)."""
        keys: list[KeyInfo] = []
        rejected: dict[str, str] = {}
        for name, raw in text_map(self._redis.hgetall(self._key)).items():
            try:
                info = KeyInfo.model_validate_json(raw)
            except ValidationError:
                rejected[name] = f"the key register's entry {name!r} is not a key entry"
                continue
            problem = key_id_problem(info) or (
                None if info.key_id == name else f"the key register's entry {name!r} holds key {info.key_id}"
            )
            if problem is None:
                keys.append(info)
            else:
                rejected[name] = problem
        for problem in rejected.values():
            log.info("key register: %s", problem)  # the callers refuse loudly; this is for the log
        return RegisterContents(sorted(keys, key=lambda i: i.created_at), rejected)

    def all(self) -> list[KeyInfo]:
        """Every usable registered key (its id the hash of its public key), oldest first."""
        return self.contents().keys

    def ring(self) -> KeyRing:
        contents = self.contents()
        return KeyRing(contents.keys, UNPINNED_SOURCE, contents.rejected)

    def set_status(self, key_id: str, status: KeyStatus) -> KeyInfo:
        """Mark a key retired or revoked (revoked stays revoked). SigningKeyError if unknown."""
        info = self.get(key_id)
        if info is None:
            raise SigningKeyError(f"no registered key {key_id!r} (see `sandfleet keys list`)")
        if info.status == KeyStatus.REVOKED or info.status == status:
            return info
        info = info.with_status(status)
        self._redis.hset(self._key, key_id, info.model_dump_json())
        return info

    def retire_others(self, worker: str, keep: str) -> list[str]:
        """Retire ``worker``'s active keys other than ``keep`` (it lost or replaced its key file)."""
        retired = [i.key_id for i in self.all() if i.worker == worker and i.status == KeyStatus.ACTIVE]
        retired = [key_id for key_id in retired if key_id != keep]
        for key_id in retired:
            self.set_status(key_id, KeyStatus.RETIRED)
        return retired


def start_signer(settings: Settings, worker: str, registry: KeyRegistry) -> FileSigner:
    """The worker's signer: its key file made if missing, its public key registered.

    Raises:
        SigningKeyError: the key file cannot be read or written, its key was revoked (a worker
            never signs with a revoked key: rotate it with ``sandfleet keys rotate``), or the register
            holds another public key under its key id (replaced by someone who can write Redis).
    """
    path = key_path(settings.worker_state_dir, worker)
    key, _created = load_or_create_key(path, worker)
    stored = registry.register(key.info)
    if stored.public_key != key.info.public_key:
        raise SigningKeyError(
            f"the key registered under this worker's key id {key.key_id} is not its own public key "
            f"({path}): someone who can write Redis replaced the entry, and what this worker signs would "
            "not verify. Check who can write Redis, then remove the entry (field "
            f"{key.key_id} of {registry.name}) and start again"
        )
    if stored.worker != worker:
        raise SigningKeyError(
            f"key {key.key_id} in {path} is registered to worker {stored.worker}, not {worker}"
        )
    if stored.status == KeyStatus.REVOKED:
        raise SigningKeyError(
            f"the signing key {key.key_id} of worker {worker} ({path}) is revoked: "
            f"make a new one with `sandfleet keys rotate {worker}` on this host"
        )
    if retired := registry.retire_others(worker, keep=key.key_id):
        log.warning("worker %s: retired its earlier key(s) %s", worker, ", ".join(retired))
    remember_host_key(settings.worker_state_dir, key.info)  # what this host's workers trust unpinned
    return FileSigner(path, worker)


def rotate_key(
    settings: Settings, worker: str, registry: KeyRegistry, *, revoke: bool = False
) -> tuple[KeyInfo | None, KeyInfo]:
    """Give ``worker`` a new key pair on this host: ``(old key's info or None, new key's info)``.

    The new public key is registered before the key file is replaced, so nothing is ever signed with
    an unregistered key; the old private key is overwritten. A running worker picks the new key up at
    its next signature. The old key is retired (its signatures still verify) or, with ``revoke``,
    revoked (every entry it signed is refused from then on).
    """
    path = key_path(settings.worker_state_dir, worker)
    old = read_key(path, worker) if path.exists() else None
    new = WorkerKey.generate(worker)
    registry.register(new.info)
    remember_host_key(settings.worker_state_dir, new.info)  # trusted here before anything is signed
    write_key(path, new)
    old_info = None
    if old is not None:
        registry.register(old.info)  # a key made before its worker ever started: register it to retire it
        old_info = registry.set_status(old.key_id, KeyStatus.REVOKED if revoke else KeyStatus.RETIRED)
        if revoke:
            forget_host_key(settings.worker_state_dir, old.key_id)
        else:  # retired: what it signed (a job it suspended) still resumes on this host
            remember_host_key(settings.worker_state_dir, old.info)
    return old_info, new.info


def verification_ring(settings: Settings, registry: KeyRegistry) -> KeyRing:
    """The keys to verify with: the pinned key set (``settings.trusted_keys``) with the revocations
    registered in Redis applied, or else the fleet's key register in Redis (not pinned)."""
    registered = registry.contents()
    if settings.trusted_keys:
        return trusted_ring(settings.trusted_keys).with_revocations(registered.keys)
    return KeyRing(registered.keys, UNPINNED_SOURCE, registered.rejected)


def acting_ring(settings: Settings, registry: KeyRegistry) -> KeyRing:
    """The keys a worker process acts on state with, before it knows its own key: the pinned key set
    (``SANDFLEET_TRUSTED_KEYS``) or else this host's keys
    (:func:`~sandfleet.core.host_keys.host_ring`), the revocations registered in Redis applied."""
    registered = registry.contents()
    base = (
        trusted_ring(settings.trusted_keys) if settings.trusted_keys else host_ring(settings.worker_state_dir)
    )
    return base.with_revocations(registered.keys)


def worker_ring(settings: Settings, registry: KeyRegistry, own: KeyInfo) -> KeyRing:
    """The keys a worker checks a job's chain with before it acts on state the chain commits to (a
    checkpoint, an approved call's outcome, a committed webhook): :func:`acting_ring` plus its own key.

    Never the register's additions: whoever writes Redis can add a key, and a worker acting on state
    signed with it would run a planted checkpoint. Readers (``result``, ``audit --verify``, ``replay``)
    keep :func:`verification_ring`: they only report, and say which keys they used. Its own key a
    worker knows from its private key file, so no register entry can take its place.
    """
    return acting_ring(settings, registry).with_own(own)


def trust_problems(settings: Settings, registry: KeyRegistry, own: KeyInfo) -> list[str]:
    """What a starting worker should warn its operator of about the keys it will act on (empty: none).

    Pinned, its own key missing from the set: other workers pinning that set refuse what it signs.
    Unpinned, active keys in the register that were not made on this host: state they sign (a job they
    suspend, a webhook they commit) is refused here unless the fleet's key set is pinned.

    Raises:
        SigningKeyError: the pinned key set cannot be read (the worker refuses to start).
    """
    if settings.trusted_keys:
        if own.key_id in trusted_ring(settings.trusted_keys):
            return []
        return [
            f"its key {own.key_id} is not in the pinned key set {settings.trusted_keys}: other workers and "
            "auditors pinning it refuse what this worker signs; export the key set again"
        ]
    local = host_ring(settings.worker_state_dir)
    others = sorted(
        {i.worker for i in registry.all() if i.status == KeyStatus.ACTIVE and i.key_id not in local}
        - {own.worker}
    )
    if not others:
        return []
    shown = ", ".join(others[:5]) + (f" and {len(others) - 5} more" if len(others) > 5 else "")
    return [
        f"the key register lists workers whose keys were not made on this host ({shown}): a job they "
        "suspended or whose webhook they committed is refused here (untrusted_state) unless "
        "SANDFLEET_TRUSTED_KEYS pins the fleet's key set (`sandfleet keys export`, checked against "
        "`sandfleet keys list`); without it this worker acts only on state signed on this host"
    ]


def trusted_ring(path: str | Path) -> KeyRing:
    """The key set pinned in ``path`` (an export of ``sandfleet keys export``)."""
    import json

    source = str(path)
    try:
        data = json.loads(Path(path).expanduser().read_text())
    except (OSError, ValueError) as e:
        raise SigningKeyError(f"cannot read the key set {source}: {e}") from e
    return KeyRing.from_export(data, f"the pinned key set {source}")
