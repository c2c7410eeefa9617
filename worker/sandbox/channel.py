"""The host's end of the wire to a container's agent: its stdin and (demultiplexed) stdout.

Docker's attach stream without a TTY prefixes each chunk with 8 bytes (stream, 0, 0, 0, size);
stdout carries the agent's frames, stderr only its crash reports (kept as a bounded tail).
Headers sent are marshal data (the agent reads them without importing json); headers received are
JSON. Nothing from the container is trusted: a frame larger than the caller allows, an unknown kind
or a malformed header ends the conversation with ChannelError, and memory stays bounded.
"""

from __future__ import annotations

import json
import marshal
import select
import socket
import struct
import threading
import time
from typing import Any

HEAD = struct.Struct("!cII")
DOCKER_HEAD = struct.Struct(">BxxxL")
STDERR_TAIL_BYTES = 16 * 1024
MAX_HEADER_BYTES = 64 * 1024
RECV_BYTES = 1 << 20


class ChannelError(Exception):
    """The agent broke the protocol, went away, or did not answer in time."""


class ChannelClosedError(ChannelError):
    """The container's output ended (the agent exited or the container died)."""


class ChannelTimeoutError(ChannelError):
    """No frame arrived before the deadline."""


def encode(kind: bytes, header: dict[str, Any] | None = None, body: bytes = b"") -> bytes:
    """A frame for the agent. Marshal version 4 is read the same by every Python since 3.4."""
    data = marshal.dumps(header, 4) if header else b""
    return HEAD.pack(kind, len(data), len(body)) + data + body


class AgentChannel:
    """Frames to and from one container's agent over a hijacked attach socket."""

    def __init__(self, sock: socket.socket) -> None:
        self._sock = sock
        self._raw = bytearray()  # attach stream, not yet demultiplexed
        self._out = bytearray()  # agent stdout: frames
        self._pending_stream = 0
        self._pending_left = 0
        self.stderr_tail = bytearray()
        self.closed = False
        self._broken: str | None = None  # why a write failed, if one did
        self._send_lock = threading.Lock()

    def send(
        self,
        kind: bytes,
        header: dict[str, Any] | None = None,
        body: bytes = b"",
        wait_s: float | None = None,
    ) -> None:
        self.send_raw(encode(kind, header, body), wait_s=wait_s)

    def send_raw(self, data: bytes, wait_s: float | None = None) -> None:
        """Write one frame whole; frames from several threads never interleave.

        ``wait_s``: how long to wait for another thread's write to finish first (None: as long as it
        takes); past it this write fails like a broken channel, and later ones still try.
        """
        # Once a write failed (or timed out: the agent stopped reading its stdin), every later one fails
        # at once; trying again would block for the socket's timeout each time.
        if self.closed:
            raise ChannelClosedError(self._closed_message())
        if not self._send_lock.acquire(timeout=-1 if wait_s is None else wait_s):
            raise ChannelClosedError("another write to the sandbox has not finished")
        try:
            self._sock.sendall(data)
        except OSError as e:
            self.closed = True
            self._broken = f"cannot write to the sandbox: {e}"
            raise ChannelClosedError(self._broken) from e
        finally:
            self._send_lock.release()

    def share(self) -> None:
        """From now on threads write while another reads (with :meth:`recv_polled`): the socket goes
        blocking, since a timeout set for a read would also cut a concurrent write short."""
        self._sock.settimeout(None)

    def recv(self, deadline: float | None, max_body: int) -> tuple[bytes, dict[str, Any], bytes]:
        """The next frame (kind, header, body); waits until ``deadline`` (time.monotonic())."""
        while True:
            frame = self._next_frame(max_body)
            if frame is not None:
                return frame
            self._fill(deadline)

    def recv_polled(self, deadline: float | None, max_body: int) -> tuple[bytes, dict[str, Any], bytes]:
        """Like :meth:`recv`, waiting in select() instead of a socket timeout (see :meth:`share`)."""
        while True:
            frame = self._next_frame(max_body)
            if frame is not None:
                return frame
            if self.closed:
                raise ChannelClosedError(self._closed_message())
            timeout = None if deadline is None else deadline - time.monotonic()
            if timeout is not None and timeout <= 0:
                raise ChannelTimeoutError("the sandbox did not answer in time")
            readable, _, _ = select.select([self._sock], [], [], timeout)
            if readable:
                self._read_available()

    def _fill(self, deadline: float | None) -> None:
        if self.closed:
            raise ChannelClosedError(self._closed_message())
        timeout = None if deadline is None else deadline - time.monotonic()
        if timeout is not None and timeout <= 0:
            raise ChannelTimeoutError("the sandbox did not answer in time")
        self._sock.settimeout(timeout)
        try:
            data = self._sock.recv(RECV_BYTES)
        except TimeoutError as e:
            raise ChannelTimeoutError("the sandbox did not answer in time") from e
        except OSError as e:
            self.closed = True
            raise ChannelClosedError(f"{self._closed_message()} ({e})") from e
        self._received(data)

    def _read_available(self) -> None:
        """Read what select() said is there (the socket is blocking: this returns at once)."""
        try:
            data = self._sock.recv(RECV_BYTES)
        except OSError as e:
            self.closed = True
            raise ChannelClosedError(f"{self._closed_message()} ({e})") from e
        self._received(data)

    def _received(self, data: bytes) -> None:
        if not data:
            self.closed = True
            raise ChannelClosedError(self._closed_message())
        self._demux(data)

    def _demux(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            if self._pending_left:
                n = min(self._pending_left, len(view))
                chunk, view = view[:n], view[n:]
                self._pending_left -= n
                if self._pending_stream == 2:
                    self.stderr_tail += chunk
                    del self.stderr_tail[:-STDERR_TAIL_BYTES]
                else:
                    self._out += chunk
                continue
            self._raw += view
            view = memoryview(b"")
            if len(self._raw) < DOCKER_HEAD.size:
                return
            stream, size = DOCKER_HEAD.unpack_from(self._raw)
            rest = bytes(self._raw[DOCKER_HEAD.size :])
            self._raw.clear()
            self._pending_stream, self._pending_left = stream, size
            view = memoryview(rest)

    def _next_frame(self, max_body: int) -> tuple[bytes, dict[str, Any], bytes] | None:
        if len(self._out) < HEAD.size:
            return None
        kind, hlen, blen = HEAD.unpack_from(self._out)
        if hlen > MAX_HEADER_BYTES or blen > max_body:
            raise ChannelError(
                f"the sandbox sent a frame of {hlen + blen} bytes, more than the {max_body} allowed"
            )
        end = HEAD.size + hlen + blen
        if len(self._out) < end:
            return None
        try:
            header = json.loads(bytes(self._out[HEAD.size : HEAD.size + hlen]) or b"{}")
        except ValueError as e:
            raise ChannelError(f"the sandbox sent a malformed frame header: {e}") from e
        if not isinstance(header, dict):
            raise ChannelError("the sandbox sent a frame header that is not an object")
        body = bytes(self._out[HEAD.size + hlen : end])
        del self._out[:end]
        return kind, header, body

    def is_open(self) -> bool:
        """False when the stream has ended (the container died while idle, e.g. the engine restarted)."""
        if self.closed:
            return False
        try:
            readable, _, _ = select.select([self._sock], [], [], 0)
            if not readable:
                return True
            return bool(self._sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT))
        except (BlockingIOError, InterruptedError):
            return True
        except (OSError, ValueError):
            return False

    def _closed_message(self) -> str:
        if self._broken:
            return self._broken
        tail = self.stderr_tail.decode(errors="replace").strip()
        return "the sandbox closed its output" + (f"; it said: {tail[-2000:]}" if tail else "")

    def close(self) -> None:
        self.closed = True
        try:
            self._sock.close()
        except OSError:
            pass
