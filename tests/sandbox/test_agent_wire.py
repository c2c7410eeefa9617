"""The agent's boot loader and wire encodings, run with this host's Python: no engine needed."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from types import ModuleType

import pytest

from sandfleet.worker.sandbox.channel import encode
from sandfleet.worker.sandbox.docker.spec import AGENT_SOURCE, BOOT, boot_payload


def load_agent() -> ModuleType:
    """The agent's module without starting it (it serves only as __main__ or sandfleet_agent)."""
    spec = importlib.util.spec_from_file_location("agent_under_test", AGENT_SOURCE)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def boot(payload: bytes) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-I", "-S", "-c", BOOT], input=payload, capture_output=True, timeout=30
    )


def test_boot_runs_the_hosts_bytecode_when_the_magic_matches() -> None:
    done = boot(boot_payload(b"print(BOOTED_FROM, __name__)"))
    assert done.returncode == 0, done.stderr
    assert done.stdout == b"bytecode sandfleet_agent\n"


def test_boot_compiles_the_source_when_the_python_differs() -> None:
    done = boot(boot_payload(b"print(BOOTED_FROM, __name__)", magic=b"\x00\x00\r\n"))
    assert done.returncode == 0, done.stderr
    assert done.stdout == b"source sandfleet_agent\n"


def test_boot_exits_when_the_payload_is_cut_short() -> None:
    assert boot(boot_payload(b"print(1)")[:-3]).returncode == 3


@pytest.mark.parametrize(
    "header",
    [
        {},
        {"ok": True, "size": 0, "error": None},
        {"error": 'quote " backslash \\ newline \n tab \t bell \x07 é € 😀'},
        {"files": ["a", "b/c", "undecodable-\udc80-name"]},
        {"exit_code": -9, "run_s": 0.125, "nested": {"list": [1, 2.5, False, None]}},
    ],
)
def test_agent_headers_are_json_the_host_reads_back(header: dict[str, object]) -> None:
    agent = load_agent()
    text = agent.to_json(header).encode("utf-8", "backslashreplace")
    assert json.loads(text) == header


def test_agent_writes_non_finite_floats_as_null() -> None:
    agent = load_agent()
    assert json.loads(agent.to_json({"a": float("nan"), "b": float("inf")})) == {"a": None, "b": None}


def test_host_headers_reach_the_agent_intact() -> None:
    agent = load_agent()
    header = {
        "argv": ["python3", "-s", "/workspace/program.py"],
        "env": {"PATH": "/usr/bin", "GREETING": "héllo"},
        "timeout": 2.5,
        "cwd": None,
        "bridge": True,
        "max_output": 1 << 20,
    }
    reader = agent.HostReader()
    reader.buf += encode(b"E", header, b"stdin") + encode(b"P")
    assert list(reader.frames()) == [(b"E", header, b"stdin"), (b"P", {}, b"")]
    assert not reader.buf


def test_agent_frames_reach_the_host_through_the_attach_stream() -> None:
    """What the agent writes (protocol.agent_frame) read back by the host's channel from a real
    socket carrying Docker's attach multiplexing, split at awkward places, with stderr between."""
    import socket

    from sandfleet.worker.sandbox.channel import AgentChannel
    from sandfleet.worker.sandbox.docker.attach import DOCKER_HEAD, AttachStream
    from sandfleet.worker.sandbox.inside import protocol

    frames = [
        (protocol.HELLO, {"pid": 1, "syscall_filter": True}, b""),
        (protocol.DONE, {"exit_code": 0, "out_len": 3, "files": ["undecodable-\udc80"]}, b"out"),
    ]
    stdout = b"".join(protocol.agent_frame(*frame) for frame in frames)
    muxed = (
        DOCKER_HEAD.pack(1, 5)
        + stdout[:5]
        + DOCKER_HEAD.pack(2, 6)
        + b"oops!\n"
        + DOCKER_HEAD.pack(1, len(stdout) - 5)
        + stdout[5:]
    )
    host, container = socket.socketpair()
    try:
        for i in range(0, len(muxed), 7):  # chunk headers cut in two as well
            container.sendall(muxed[i : i + 7])
        container.shutdown(socket.SHUT_WR)
        channel = AgentChannel(AttachStream(host))
        received = [channel.recv(deadline=None, max_body=1024) for _ in frames]
        assert [kind for kind, _, _ in received] == [protocol.HELLO, protocol.DONE]
        assert received[0][1] == frames[0][1]
        assert received[1][1] == frames[1][1]  # the lone surrogate too, as a JSON escape
        assert received[1][2] == b"out"
        assert bytes(channel.stderr_tail) == b"oops!\n"
    finally:
        host.close()
        container.close()


def test_a_large_collect_answer_is_received_in_place_and_hashed_as_it_arrives() -> None:
    """A COLLECT answer of two files (1.5 MiB) through a real socket with Docker's multiplexing, cut
    into odd chunks with stderr between and a frame right behind it: the watched body is received
    whole into one buffer, the host's hashes while arriving equal hashlib's of the bytes, and the
    next frame is read intact."""
    import hashlib
    import os
    import socket
    import threading

    from sandfleet.core.artifacts import sha256_bytes
    from sandfleet.worker.program.artifacts import ArrivalHasher, ArtifactCaps, parse_collection
    from sandfleet.worker.sandbox.channel import AgentChannel
    from sandfleet.worker.sandbox.docker.attach import DOCKER_HEAD, AttachStream
    from sandfleet.worker.sandbox.inside import protocol

    files = [("a.bin", os.urandom(1024**2)), ("sub/b.bin", os.urandom(512 * 1024 + 7)), ("empty", b"")]
    listing = json.dumps({"files": [{"name": n, "size": len(d)} for n, d in files], "skipped": []}).encode()
    answer = protocol.agent_frame(
        protocol.ANSWER, {"ok": True, "listing_len": len(listing)}, listing + b"".join(d for _, d in files)
    )
    stdout = answer + protocol.agent_frame(protocol.ANSWER, {"ok": True}, b"after")
    muxed = bytearray()
    for i, step in enumerate(range(0, len(stdout), 32 * 1024 + 3)):
        muxed += (
            DOCKER_HEAD.pack(1, len(stdout[step : step + 32 * 1024 + 3]))
            + stdout[step : step + 32 * 1024 + 3]
        )
        if i == 5:
            muxed += DOCKER_HEAD.pack(2, 4) + b"err\n"
    host, container = socket.socketpair()

    def send() -> None:
        for i in range(0, len(muxed), 50_001):  # chunk headers and frame heads cut in two
            container.sendall(muxed[i : i + 50_001])
        container.shutdown(socket.SHUT_WR)

    sender = threading.Thread(target=send)
    sender.start()
    try:
        channel = AgentChannel(AttachStream(host))
        hasher = ArrivalHasher()
        kind, header, body = channel.recv_watched(None, 4 * 1024**2, hasher)
        assert kind == protocol.ANSWER and isinstance(body, bytearray)
        assert bytes(body) == listing + b"".join(d for _, d in files)
        sizes = [len(d) for _, d in files]
        assert hasher.digests(sizes) == [hashlib.sha256(d).hexdigest() for _, d in files]
        assert hasher.digests([*sizes, 1]) is None  # not the listing it hashed: not used
        got = parse_collection(header, body, ArtifactCaps(), hasher)
        assert [(a.info.name, a.info.sha256) for a in got.kept] == [(n, sha256_bytes(d)) for n, d in files]
        assert [bytes(a.data) for a in got.kept] == [d for _, d in files]
        assert channel.recv(deadline=None, max_body=1024) == (protocol.ANSWER, {"ok": True}, b"after")
        assert bytes(channel.stderr_tail) == b"err\n"
    finally:
        sender.join()
        host.close()
        container.close()


def test_the_arrival_hasher_gives_up_on_a_listing_it_cannot_read() -> None:
    """A forged listing (not JSON, negative size, bad listing_len) leaves the hashing to
    parse_collection, which refuses or hashes by itself."""
    from sandfleet.worker.program.artifacts import ArrivalHasher

    for header, body in (
        ({"listing_len": 3}, b"{x}" + b"data"),
        ({"listing_len": 34}, b'{"files":[{"name":"a","size":-1}]}'),
        ({"listing_len": "3"}, b"{}"),
    ):
        hasher = ArrivalHasher()
        hasher.begin(header, len(body))
        hasher.arrived(memoryview(bytearray(body)), len(body))
        assert hasher.digests([]) is None and hasher.digests([-1]) is None


@pytest.mark.parametrize("depth", [65, 1000, 20_000])
def test_a_frame_header_nested_past_the_cap_ends_the_conversation_naming_it(depth: int) -> None:
    """A header is JSON the host parses: one nested past MAX_JSON_DEPTH is refused before json's
    decoder (which raises RecursionError, not the channel's error, from ~1000 levels on)."""
    import socket

    from sandfleet.worker.sandbox.channel import AgentChannel, ChannelError
    from sandfleet.worker.sandbox.docker.attach import DOCKER_HEAD, AttachStream
    from sandfleet.worker.sandbox.inside import protocol

    header = ('{"exit_code": ' + "[" * depth + "]" * depth + "}").encode()
    frame = protocol.pack(protocol.DONE, header, b"")
    host, container = socket.socketpair()
    try:
        container.sendall(DOCKER_HEAD.pack(1, len(frame)) + frame)
        container.shutdown(socket.SHUT_WR)
        channel = AgentChannel(AttachStream(host))
        with pytest.raises(ChannelError) as caught:
            channel.recv(deadline=None, max_body=1024)
        assert "the sandbox sent a malformed frame header: the header is nested more than 64 deep" in str(
            caught.value
        )
    finally:
        host.close()
        container.close()
