"""The host's end of the conversation with a container's agent: frames over the sandbox's byte stream.

The frames are protocol.py's; the stream (the container's stdin and stdout) is the backend's
(attach.AttachStream for Docker). Nothing from the container is trusted: a frame larger than the
caller allows, an unknown kind or a malformed header (or one nested past ``MAX_JSON_DEPTH``) ends the
conversation with ChannelError, and memory stays bounded.

A large body the caller watches (:class:`BodyWatcher`, e.g. the artifacts of a run) is received
straight into one buffer of its announced size, and the watcher sees each piece as it lands (to hash
it while the rest is still on its way) instead of after the whole frame was copied together.
"""

from __future__ import annotations

import threading
import time
from typing import Any, Protocol

from sandfleet.core import json_limits
from sandfleet.worker.sandbox.inside import protocol


class ChannelError(Exception):
    """The agent broke the protocol, went away, or did not answer in time."""


class ChannelClosedError(ChannelError):
    """The container's output ended (the agent exited or the container died)."""


class ChannelTimeoutError(ChannelError):
    """No frame arrived before the deadline."""


class SandboxStream(Protocol):
    """A sandbox's stdin and stdout, as its backend connects them."""

    stderr_tail: bytearray  # the last bytes the sandbox wrote to stderr (its crash reports)

    def send(self, data: bytes) -> None:
        """Write all of ``data``. Raises OSError (TimeoutError: the sandbox stopped reading).

        May run while another thread is in ``read``: a read's timeout must not bound a write."""

    def read(self, timeout: float | None) -> bytes:
        """Some stdout bytes (maybe none) within ``timeout`` s. Raises TimeoutError, EOFError, OSError."""
        ...

    def is_open(self) -> bool:
        """False once the stream has ended, without waiting."""
        ...

    def close(self) -> None: ...


class BodyWatcher(Protocol):
    """Sees a large frame body as it arrives (the channel owns the buffer; nothing here may raise)."""

    def begin(self, header: dict[str, Any], size: int) -> None:
        """A body of ``size`` bytes follows the frame header ``header`` (already parsed)."""

    def arrived(self, body: memoryview, filled: int) -> None:
        """``body[:filled]`` has arrived (``filled`` only grows); the rest is not there yet."""


WATCHED_BODY_BYTES = 256 * 1024  # a watched body from this size on is received in place


def encode(kind: bytes, header: dict[str, Any] | None = None, body: bytes = b"") -> bytes:
    """A frame for the agent."""
    return protocol.host_frame(kind, header, body)


class AgentChannel:
    """Frames to and from one container's agent."""

    def __init__(self, stream: SandboxStream) -> None:
        self._stream = stream
        self._out = bytearray()  # agent stdout not yet parsed into frames
        self.closed = False
        self._broken: str | None = None  # why a write failed, if one did
        self._send_lock = threading.Lock()  # tool replies are written from several threads
        # A watched frame being received in place: its kind and header, its body buffer, how much of
        # the body has arrived, and who watches it.
        self._frame: tuple[bytes, dict[str, Any]] | None = None
        self._body = bytearray()
        self._filled = 0
        self._watcher: BodyWatcher | None = None

    @property
    def stderr_tail(self) -> bytearray:
        return self._stream.stderr_tail

    def send(
        self,
        kind: bytes,
        header: dict[str, Any] | None = None,
        body: bytes = b"",
        wait_s: float | None = None,
    ) -> None:
        self.send_raw(encode(kind, header, body), wait_s=wait_s)

    def send_raw(self, data: bytes, wait_s: float | None = None) -> None:
        """Write one frame whole; frames written from several threads never interleave.

        ``wait_s``: how long to wait for another thread's write to finish first (None: as long as it
        takes); past it this write fails like a broken channel would, and later ones still try.
        """
        # Once a write failed (or timed out: the agent stopped reading its stdin), every later one fails
        # at once; trying again would block for the socket's timeout each time.
        if self.closed:
            raise ChannelClosedError(self._closed_message())
        if not self._send_lock.acquire(timeout=-1 if wait_s is None else wait_s):
            raise ChannelClosedError("another write to the sandbox has not finished")
        try:
            self._stream.send(data)
        except OSError as e:
            self.closed = True
            self._broken = f"cannot write to the sandbox: {e}"
            raise ChannelClosedError(self._broken) from e
        finally:
            self._send_lock.release()

    def recv(self, deadline: float | None, max_body: int) -> tuple[bytes, dict[str, Any], bytes]:
        """The next frame (kind, header, body); waits until ``deadline`` (time.monotonic())."""
        kind, header, body = self.recv_watched(deadline, max_body, None)
        return kind, header, bytes(body)  # already bytes: no copy

    def recv_watched(
        self, deadline: float | None, max_body: int, watcher: BodyWatcher | None
    ) -> tuple[bytes, dict[str, Any], bytes | bytearray]:
        """As ``recv``; with ``watcher``, a body of WATCHED_BODY_BYTES or more is received in place
        and returned as that bytearray (no copy), the watcher told of each piece as it lands."""
        while True:
            frame = self._next_frame(max_body, watcher)
            if frame is not None:
                return frame
            self._fill(deadline)

    def _fill(self, deadline: float | None) -> None:
        if self.closed:
            raise ChannelClosedError(self._closed_message())
        timeout = None if deadline is None else deadline - time.monotonic()
        if timeout is not None and timeout <= 0:
            raise ChannelTimeoutError("the sandbox did not answer in time")
        try:
            data = self._stream.read(timeout)
        except TimeoutError as e:
            raise ChannelTimeoutError("the sandbox did not answer in time") from e
        except EOFError as e:
            self.closed = True
            raise ChannelClosedError(self._closed_message()) from e
        except OSError as e:
            self.closed = True
            raise ChannelClosedError(f"{self._closed_message()} ({e})") from e
        if self._frame is not None:
            self._place(memoryview(data))
        else:
            self._out += data

    def _place(self, data: memoryview) -> None:
        """Bytes of the watched body into its buffer; what follows the body waits in ``_out``."""
        n = min(len(data), len(self._body) - self._filled)
        self._body[self._filled : self._filled + n] = data[:n]
        self._filled += n
        if n < len(data):
            self._out += data[n:]
        if n and self._watcher is not None:
            self._watcher.arrived(memoryview(self._body), self._filled)

    def _next_frame(
        self, max_body: int, watcher: BodyWatcher | None
    ) -> tuple[bytes, dict[str, Any], bytes | bytearray] | None:
        if self._frame is not None:
            return self._finish_watched()
        head = protocol.HEAD
        if len(self._out) < head.size:
            return None
        kind, hlen, blen = head.unpack_from(self._out)
        if hlen > protocol.MAX_HEADER_BYTES or blen > max_body:
            raise ChannelError(
                f"the sandbox sent a frame of {hlen + blen} bytes, more than the {max_body} allowed"
            )
        end = head.size + hlen + blen
        if watcher is not None and blen >= WATCHED_BODY_BYTES and len(self._out) >= head.size + hlen:
            header = self._header(head.size, hlen)
            rest = self._out[head.size + hlen :]  # what of the body came with the header
            self._out.clear()
            self._frame, self._body, self._filled, self._watcher = (kind, header), bytearray(blen), 0, watcher
            watcher.begin(header, blen)
            self._place(memoryview(rest))
            return self._finish_watched()
        if len(self._out) < end:
            return None
        header = self._header(head.size, hlen)
        body = bytes(self._out[head.size + hlen : end])
        del self._out[:end]
        return kind, header, body

    def _header(self, start: int, length: int) -> dict[str, Any]:
        data = bytes(self._out[start : start + length])
        try:
            json_limits.check_depth(data, "the header")  # before json's decoder, which recurses
            return protocol.read_agent_header(data)
        except ValueError as e:  # JsonLimitError too
            raise ChannelError(f"the sandbox sent a malformed frame header: {e}") from e

    def _finish_watched(self) -> tuple[bytes, dict[str, Any], bytearray] | None:
        """The watched frame once its whole body is in, else None."""
        if self._frame is None or self._filled < len(self._body):
            return None
        (kind, header), body = self._frame, self._body
        self._frame, self._body, self._filled, self._watcher = None, bytearray(), 0, None
        return kind, header, body  # a bytearray, received in place

    def is_open(self) -> bool:
        """False when the stream has ended (the container died while idle, e.g. the engine restarted)."""
        return not self.closed and self._stream.is_open()

    def _closed_message(self) -> str:
        if self._broken:
            return self._broken
        tail = self.stderr_tail.decode(errors="replace").strip()
        return "the sandbox closed its output" + (f"; it said: {tail[-2000:]}" if tail else "")

    def close(self) -> None:
        self.closed = True
        self._stream.close()
