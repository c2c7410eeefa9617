"""The agent's compiled payload is cached beside the package's bytecode, and only a cache made from the
same sources is ever used (spec.agent_payload). Pure: no engine needed."""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Iterator
from pathlib import Path

import pytest

from sandfleet.worker.sandbox.docker import spec


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    path = tmp_path / "__pycache__" / "agent-payload.bin"
    monkeypatch.setattr(spec, "PAYLOAD_CACHE", path)
    monkeypatch.setattr(spec.sys, "dont_write_bytecode", False)
    spec.agent_payload.cache_clear()
    yield path
    spec.agent_payload.cache_clear()


def is_the_agent(payload: bytes) -> bool:
    """Framed as BOOT reads it: the magic first, the agent's own source last."""
    magic = struct.pack("!I", len(spec.MAGIC_NUMBER)) + spec.MAGIC_NUMBER
    return payload.startswith(magic) and payload.endswith(spec.AGENT_SOURCE.read_bytes())


def key() -> bytes:
    sources = [spec.AGENT_SOURCE.read_bytes(), *(p.read_bytes() for p in spec.AGENT_MODULES.values())]
    framed = b"".join(struct.pack("!I", len(s)) + s for s in sources)
    return hashlib.sha256(spec.MAGIC_NUMBER + framed).digest()


def test_the_first_build_is_cached_under_the_key_of_its_sources(cache: Path) -> None:
    payload = spec.agent_payload()
    assert is_the_agent(payload) and cache.read_bytes() == key() + payload
    assert list(cache.parent.iterdir()) == [cache]  # no partial file left


def test_a_cache_of_other_sources_is_never_used_and_is_rebuilt(cache: Path) -> None:
    cache.parent.mkdir()
    cache.write_bytes(hashlib.sha256(b"an older agent").digest() + b"not the agent")
    payload = spec.agent_payload()
    assert is_the_agent(payload) and b"not the agent" not in payload
    assert cache.read_bytes() == key() + payload


def test_nothing_is_written_where_python_writes_no_bytecode(
    cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(spec.sys, "dont_write_bytecode", True)
    assert is_the_agent(spec.agent_payload())
    assert not cache.exists()
