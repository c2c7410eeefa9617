"""This host's key set (sandfleet/core/host_keys.py): what an unpinned worker acts on. Pure (files)."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from sandfleet.core.chain import signed_message
from sandfleet.core.errors import SigningKeyError
from sandfleet.core.host_keys import forget_host_key, host_keys_dir, host_ring, remember_host_key
from sandfleet.core.signing import WorkerKey


def test_only_well_formed_entries_under_their_own_key_id_are_trusted(tmp_path: Path) -> None:
    genuine, renamed, stranger = (WorkerKey.generate(f"w{i}@h") for i in range(3))
    remember_host_key(tmp_path, genuine.info)
    folder = host_keys_dir(tmp_path)
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700
    (folder / f"{stranger.key_id}.json").write_text(renamed.info.model_dump_json())  # filed under another id
    (folder / "garbage.json").write_text("{not json")
    swapped = genuine.info.model_copy(update={"public_key": stranger.info.public_key})
    with pytest.raises(SigningKeyError, match="not the hash of its public key"):
        remember_host_key(tmp_path, swapped)
    ring = host_ring(tmp_path)
    message = signed_message("job", "link")
    assert ring.check(genuine.key_id, message, genuine.sign(message)) is None
    for other in (renamed, stranger):
        assert "not in the key set (this host's keys" in str(
            ring.check(other.key_id, message, other.sign(message))
        )
    forget_host_key(tmp_path, genuine.key_id)
    assert genuine.key_id not in host_ring(tmp_path)
    assert list(host_ring(tmp_path / "never-made").infos) == []  # no folder: no key trusted
