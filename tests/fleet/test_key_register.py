"""A key id is the hash of its public key, recomputed wherever keys are read (issue 22): the register
on a real Redis written by an attacker with plain commands, the key sets built from it, a worker's
start and the keys a worker verifies with before it uses state read back from Redis."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import redis

from sandfleet.core.chain import signed_message
from sandfleet.core.errors import SigningKeyError
from sandfleet.core.key_registry import (
    KeyRegistry,
    rotate_key,
    start_signer,
    trust_problems,
    trusted_ring,
    verification_ring,
    worker_ring,
)
from sandfleet.core.redis_keys import FleetKeys
from sandfleet.core.settings import Settings
from sandfleet.core.signing import FileSigner, KeyInfo, KeyRing, KeyStatus, WorkerKey, key_id_problem
from sandfleet.worker.delivery.celery_app import create_app

from .helpers import TEST_WORKER


def swapped(genuine: WorkerKey) -> tuple[str, WorkerKey]:
    """The attacker's entry for ``genuine``'s key id (its own public key), and the attacker's key."""
    attacker = WorkerKey.generate(genuine.worker)
    info = genuine.info.model_copy(update={"public_key": attacker.info.public_key})
    return info.model_dump_json(), attacker


def test_an_entry_whose_id_is_not_the_hash_of_its_public_key_is_rejected_everywhere(
    settings: Settings, raw_redis: redis.Redis
) -> None:
    keys = FleetKeys(settings.key_prefix)
    registry = KeyRegistry(raw_redis, keys)
    genuine, other = WorkerKey.generate("w1@h"), WorkerKey.generate("w2@h")
    registry.register(genuine.info)
    registry.register(other.info)
    entry, attacker = swapped(genuine)
    raw_redis.hset(keys.signing_keys, genuine.key_id, entry)  # what any Redis writer can do
    raw_redis.hset(keys.signing_keys, "garbage", "{not json")
    raw_redis.hset(keys.signing_keys, "f" * 32, other.info.model_dump_json())  # a key filed under another id

    contents = registry.contents()
    assert [i.key_id for i in contents.keys] == [other.key_id]
    assert set(contents.rejected) == {genuine.key_id, "garbage", "f" * 32}
    assert "is not the hash of its public key" in contents.rejected[genuine.key_id]
    assert "not a key entry" in contents.rejected["garbage"]
    assert f"holds key {other.key_id}" in contents.rejected["f" * 32]
    assert registry.all() == contents.keys  # nothing rejected is handed out as a key
    with pytest.raises(SigningKeyError, match="not registered: key id"):
        registry.register(KeyInfo.model_validate_json(entry))

    message = signed_message("job", "link")
    ring = verification_ring(settings, registry)
    forged = ring.check(genuine.key_id, message, attacker.sign(message))
    assert forged is not None and "whose registered entry is not used" in forged
    assert "is not the hash of its public key" in forged
    real = ring.check(genuine.key_id, message, genuine.sign(message))
    assert (
        real is not None and "not used" in real
    )  # the genuine key id is unusable until the entry is removed
    assert ring.check(other.key_id, message, other.sign(message)) is None


def test_the_key_id_is_recomputed_from_the_public_key_itself() -> None:
    key = WorkerKey.generate("w@h")
    assert key_id_problem(key.info) is None
    assert "not a base64 Ed25519 key" in str(key_id_problem(key.info.model_copy(update={"public_key": "!!"})))
    ring = KeyRing([key.info.model_copy(update={"key_id": "0" * 32})], "hand-made")
    assert "0" * 32 in ring.rejected and "0" * 32 not in ring


def test_a_pinned_key_set_holding_a_swapped_entry_is_refused_whole(tmp_path: Path) -> None:
    genuine, other = WorkerKey.generate("w1@h"), WorkerKey.generate("w2@h")
    entry, _attacker = swapped(genuine)
    exported = KeyRing([other.info], "k").export("fleet")
    exported["keys"].append(json.loads(entry))
    path = tmp_path / "keys.json"
    path.write_text(json.dumps(exported))
    with pytest.raises(SigningKeyError, match=r"refused: key id .* is not the hash of its public key"):
        trusted_ring(path)


def test_a_worker_refuses_to_start_when_its_registered_key_is_not_its_own(
    settings: Settings, raw_redis: redis.Redis
) -> None:
    keys = FleetKeys(settings.key_prefix)
    registry = KeyRegistry(raw_redis, keys)
    signer = start_signer(settings, TEST_WORKER, registry)  # its key made and registered
    entry, _attacker = swapped(signer.key)
    raw_redis.hset(keys.signing_keys, signer.key.key_id, entry)
    with pytest.raises(SigningKeyError, match="is not its own public key") as refused:
        start_signer(settings, TEST_WORKER, registry)
    assert keys.signing_keys in str(refused.value)  # says which entry to remove
    raw_redis.hset(keys.signing_keys, signer.key.key_id, "{not json")
    with pytest.raises(SigningKeyError, match="not a key entry"):
        start_signer(settings, TEST_WORKER, registry)
    raw_redis.hdel(keys.signing_keys, signer.key.key_id)
    assert start_signer(settings, TEST_WORKER, registry).key.key_id == signer.key.key_id  # removed: it starts


def test_a_worker_trusts_its_own_and_its_hosts_keys_and_never_a_key_added_to_the_register(
    settings: Settings, raw_redis: redis.Redis, signer: FileSigner, tmp_path: Path
) -> None:
    keys = FleetKeys(settings.key_prefix)
    registry = KeyRegistry(raw_redis, keys)
    entry, _attacker = swapped(signer.key)
    raw_redis.hset(keys.signing_keys, signer.key.key_id, entry)  # swapped under the worker's own id
    added = WorkerKey.generate(TEST_WORKER)
    registry.register(added.info)  # a key the attacker added in the worker's name
    neighbour = start_signer(settings, "neighbour@host", registry).key  # another worker of this host
    elsewhere_settings = settings.model_copy(update={"worker_state_dir": str(tmp_path / "other-host")})
    elsewhere = start_signer(elsewhere_settings, "elsewhere@other", registry).key  # a worker of another host
    message = signed_message("job", "link")

    unpinned = worker_ring(settings, registry, signer.key_info())
    assert unpinned.check(signer.key.key_id, message, signer.key.sign(message)) is None  # its own file
    assert unpinned.check(neighbour.key_id, message, neighbour.sign(message)) is None  # this host's
    for stranger in (added, elsewhere):  # registered in Redis, not made here: never trusted to act on
        refused = unpinned.check(stranger.key_id, message, stranger.sign(message))
        assert refused is not None and "not in the key set (this host's keys in" in refused, refused
        assert "SANDFLEET_TRUSTED_KEYS" in refused
    assert "this worker's own key" in unpinned.source
    # A reader (result, audit --verify, replay) still finds keys in the register, saying so.
    assert verification_ring(settings, registry).check(added.key_id, message, added.sign(message)) is None
    [warning] = trust_problems(settings, registry, signer.key_info())
    assert "elsewhere@other" in warning and "SANDFLEET_TRUSTED_KEYS" in warning

    pinned_file = tmp_path / "pinned.json"
    pinned_file.write_text(json.dumps(KeyRing([elsewhere.info], "none").export(settings.key_prefix)))
    pinned_settings = settings.model_copy(update={"trusted_keys": str(pinned_file)})
    pinned = worker_ring(pinned_settings, registry, signer.key_info())
    assert pinned.check(signer.key.key_id, message, signer.key.sign(message)) is None
    assert pinned.check(elsewhere.key_id, message, elsewhere.sign(message)) is None  # pinned: trusted
    refused = pinned.check(added.key_id, message, added.sign(message))
    assert refused is not None and "not in the key set (the pinned key set" in refused
    assert "is not in the pinned key set" in trust_problems(pinned_settings, registry, signer.key_info())[0]

    raw_redis.hset(keys.signing_keys, signer.key.key_id, signer.key.info.model_dump_json())  # genuine again
    registry.set_status(signer.key.key_id, KeyStatus.REVOKED)  # exposed: its own worker trusts it no more
    registry.set_status(neighbour.key_id, KeyStatus.REVOKED)
    revoked = worker_ring(settings, registry, signer.key_info())
    assert "which is revoked" in str(revoked.check(signer.key.key_id, message, signer.key.sign(message)))
    assert "which is revoked" in str(revoked.check(neighbour.key_id, message, neighbour.sign(message)))


def test_a_rotated_key_stays_trusted_on_its_host_and_a_revoked_one_does_not(
    settings: Settings, raw_redis: redis.Redis, signer: FileSigner
) -> None:
    """A job suspended before a rotation resumes after it; one signed with a revoked key does not, even
    once the revocation is gone from the register (removed by a Redis writer)."""
    registry = KeyRegistry(raw_redis, FleetKeys(settings.key_prefix))
    before = signer.key
    old, new = rotate_key(settings, TEST_WORKER, registry)
    assert old is not None and old.key_id == before.key_id and old.status == KeyStatus.RETIRED
    message = signed_message("job", "link")
    ring = worker_ring(settings, registry, signer.key_info())
    assert signer.key_info().key_id == new.key_id
    assert ring.check(before.key_id, message, before.sign(message)) is None
    rotated = signer.key
    _old, _newer = rotate_key(settings, TEST_WORKER, registry, revoke=True)
    raw_redis.hdel(registry.name, rotated.key_id)  # the revocation erased from Redis
    refused = worker_ring(settings, registry, signer.key_info()).check(
        rotated.key_id, message, rotated.sign(message)
    )
    assert refused is not None and "not in the key set" in refused


def test_a_worker_with_an_unreadable_pinned_key_set_refuses_to_start(
    settings: Settings, tmp_path: Path
) -> None:
    state = create_app(settings.model_copy(update={"trusted_keys": str(tmp_path / "missing.json")})).state
    with pytest.raises(SigningKeyError, match="cannot read the key set"):
        state.load_signer("pinned-test@host")
