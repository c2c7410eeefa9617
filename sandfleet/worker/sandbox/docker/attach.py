"""A container's stdin and stdout over Docker's attach socket, demultiplexed.

Without a TTY the attach stream prefixes each chunk with 8 bytes (stream, 0, 0, 0, size): stdout
(1) carries the agent's frames, stderr (2) only its crash reports, kept as a bounded tail. This is
the byte stream the Docker backend (engine.py) hands to the agent channel (channel.py); it knows
nothing of frames, and nothing here imports the Docker SDK.
"""

from __future__ import annotations

import select
import socket
import struct

DOCKER_HEAD = struct.Struct(">BxxxL")
STDERR = 2
STDERR_TAIL_BYTES = 16 * 1024
RECV_BYTES = 1 << 20
SEND_TIMEOUT_S = 60.0  # a write the container does not take within this long fails (it stopped reading)


class AttachStream:
    """The agent's stdin (``send``) and stdout (``read``) on one hijacked attach socket."""

    def __init__(self, sock: socket.socket) -> None:
        # One fixed timeout for writes: reads wait in select() instead of changing it, so that a
        # thread writing a tool reply is never cut short by the timeout of a read in another thread.
        sock.settimeout(SEND_TIMEOUT_S)
        self._sock = sock
        self._buffer = bytearray(RECV_BYTES)  # every recv lands here: no fresh 1 MiB object per read
        self._raw = bytearray()  # a chunk header not yet complete
        self._pending_stream = 0
        self._pending_left = 0  # bytes of the current chunk still to come
        self.stderr_tail = bytearray()

    def send(self, data: bytes) -> None:
        """Write all of ``data`` to the container's stdin. Raises OSError (TimeoutError: it took more
        than SEND_TIMEOUT_S). Safe beside a ``read`` in another thread."""
        self._sock.sendall(data)

    def read(self, timeout: float | None) -> bytes:
        """The stdout bytes of the next chunk that arrives within ``timeout`` seconds (maybe none,
        when it held only stderr or part of a header).

        Raises:
            TimeoutError: nothing arrived in time.
            EOFError: the stream ended (the container's output closed).
            OSError: the socket failed.
        """
        readable, _, _ = select.select([self._sock], [], [], timeout)
        if not readable:
            raise TimeoutError("nothing arrived in time")
        received = self._sock.recv_into(self._buffer)  # there is something: this returns at once
        if not received:
            raise EOFError("the attach stream ended")
        return self._demux(memoryview(self._buffer)[:received])

    def _demux(self, view: memoryview) -> bytes:
        """The stdout bytes in ``view``, copied once: Docker cuts a large answer into 32 KiB chunks, so
        a 1 MiB read holds dozens of chunk headers, each stepped over in place."""
        out: list[memoryview] = []
        head = DOCKER_HEAD.size
        while view:
            if self._pending_left:
                n = min(self._pending_left, len(view))
                chunk, view = view[:n], view[n:]
                self._pending_left -= n
                if self._pending_stream == STDERR:
                    self.stderr_tail += chunk
                    del self.stderr_tail[:-STDERR_TAIL_BYTES]
                else:
                    out.append(chunk)
                continue
            if self._raw or len(view) < head:  # a chunk header split across reads
                need = head - len(self._raw)
                self._raw += view[:need]
                view = view[need:]
                if len(self._raw) < head:
                    break
                stream, size = DOCKER_HEAD.unpack_from(self._raw)
                self._raw.clear()
            else:
                stream, size = DOCKER_HEAD.unpack_from(view)
                view = view[head:]
            self._pending_stream, self._pending_left = stream, size
        return out[0].tobytes() if len(out) == 1 else b"".join(out)

    def is_open(self) -> bool:
        """False when the stream has ended (the container died while idle, e.g. the engine restarted)."""
        try:
            readable, _, _ = select.select([self._sock], [], [], 0)
            if not readable:
                return True
            return bool(self._sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT))
        except (BlockingIOError, InterruptedError):
            return True
        except (OSError, ValueError):
            return False

    def close(self) -> None:
        try:
            self._sock.close()
        except OSError:
            pass
