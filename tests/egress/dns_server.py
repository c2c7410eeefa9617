"""A DNS server of the test's own (UDP, standard library): the egress proxy's only resolver in the
egress tests (SANDFLEET_EGRESS_DNS_SERVERS), so that no name they look up is ever asked off the machine.

It answers A and AAAA for the names the test gives it, with TTL 0, and NXDOMAIN for every other name.
A name may have several addresses at once (``set``), or a sequence of answers, one per A query
(``set_sequence``: the last one stays), as a rebinding attacker's server would give them.
"""

from __future__ import annotations

import ipaddress
import socket
import struct
import threading
from dataclasses import dataclass, field

TYPE_A, TYPE_AAAA = 1, 28


def _name(packet: bytes, at: int) -> tuple[str, int]:
    labels = []
    while packet[at]:
        length = packet[at]
        labels.append(packet[at + 1 : at + 1 + length].decode("ascii", "replace"))
        at += 1 + length
    return ".".join(labels).lower(), at + 1


@dataclass
class TestDNSServer:
    """Bound to ``address``:53 (an address the test run owns); ``queries`` lists (name, type) asked."""

    address: str
    answers: dict[str, list[list[str]]] = field(default_factory=dict)
    queries: list[tuple[str, int]] = field(default_factory=list)
    _asked: dict[str, int] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _sock: socket.socket | None = None
    _thread: threading.Thread | None = None

    def start(self) -> TestDNSServer:
        family = socket.AF_INET6 if ":" in self.address else socket.AF_INET
        self._sock = socket.socket(family, socket.SOCK_DGRAM)
        self._sock.bind((self.address, 53))
        self._sock.settimeout(0.2)
        self._thread = threading.Thread(target=self._serve, name="test-dns", daemon=True)
        self._thread.start()
        return self

    def set(self, name: str, *addresses: str) -> None:
        """``name`` answers every address given (A and AAAA alike), for every query."""
        self.set_sequence(name, list(addresses))

    def set_sequence(self, name: str, *answers: list[str]) -> None:
        """The n-th A query of ``name`` gets ``answers[n]`` (the last one from then on); AAAA
        queries get the IPv6 addresses of the answer the last A query got."""
        with self._lock:
            self.answers[name.lower()] = [list(a) for a in answers]
            self._asked[name.lower()] = 0

    def _answer_for(self, name: str, qtype: int) -> list[str] | None:
        with self._lock:
            self.queries.append((name, qtype))
            sequence = self.answers.get(name)
            if sequence is None:
                return None
            index = self._asked[name]
            if qtype == TYPE_A:
                self._asked[name] = index + 1
            else:
                index = max(index - 1, 0)
            return sequence[min(index, len(sequence) - 1)]

    def _serve(self) -> None:
        assert self._sock is not None
        while self._sock.fileno() >= 0:
            try:
                packet, peer = self._sock.recvfrom(2048)
            except TimeoutError:
                continue
            except OSError:
                return
            try:
                reply = self.reply(packet)
            except (IndexError, struct.error, ValueError):
                continue
            try:
                self._sock.sendto(reply, peer)
            except OSError:
                continue

    def reply(self, packet: bytes) -> bytes:
        ident, _flags, count = struct.unpack("!HHH", packet[:6])
        name, end = _name(packet, 12)
        qtype, _qclass = struct.unpack("!HH", packet[end : end + 4])
        question = packet[12 : end + 4]
        addresses = self._answer_for(name, qtype) if count == 1 else None
        if addresses is None:  # NXDOMAIN, authoritative
            return struct.pack("!HHHHHH", ident, 0x8583, 1, 0, 0, 0) + question
        records = b""
        for text in addresses:
            ip = ipaddress.ip_address(text)
            if (qtype, ip.version) in ((TYPE_A, 4), (TYPE_AAAA, 6)):
                records += struct.pack("!HHHIH", 0xC00C, qtype, 1, 0, len(ip.packed)) + ip.packed
        answers = len(records) // (16 if qtype == TYPE_A else 28)
        return struct.pack("!HHHHHH", ident, 0x8580, 1, answers, 0, 0) + question + records

    def stop(self) -> None:
        if self._sock is not None:
            self._sock.close()
        if self._thread is not None:
            self._thread.join(2)
