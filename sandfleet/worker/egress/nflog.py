"""The sandbox filter's refusals, itemised: NFLOG packets read from the sandbox's own netns.

Each REJECT of the sandbox's filter (sandbox_filter.py) is preceded by a rate-limited NFLOG rule
(``--nflog-group NFLOG_GROUP``, a prefix naming the reason, the first NFLOG_SIZE bytes of the
packet). The kernel's NFLOG instances belong to a network namespace, and so does a netlink socket:
``FilterLog.open`` creates its socket inside the sandbox's namespace (netns.py ``SandboxNetns.call``,
a thread that setns(2)-ed in and out), so the socket goes on receiving that namespace's packets, and
only those, from the worker's own namespace. ``take`` drains it without blocking: destination, port,
protocol and reason of every logged packet, merged with a count. Beyond the rate limit (LIMIT per
second, burst BURST, per rule), or past the socket's buffer, a refusal is still refused and counted
by its REJECT rule, but not itemised here: the lease (gateway.py) reports those as
``refused_unlisted``. Standard library only.
"""

from __future__ import annotations

import ipaddress
import os
import socket
import struct
import threading
from dataclasses import dataclass, field
from typing import Any

from sandfleet.worker.egress.netns import NetnsError, SandboxNetns

NFLOG_GROUP = 17  # per network namespace: every sandbox may use the same group
NFLOG_SIZE = 80  # bytes of each packet copied: an IPv4 header with options, or IPv6's, and the ports
LIMIT = "20/sec"
BURST = 100
RCVBUF = 4 << 20  # bytes; at ~1 kB of socket memory per message, a few thousand unread refusals

# The prefix each NFLOG rule writes -> the reason the run's record shows.
REASONS = {
    "sf:dns": "DNS to Docker's resolver (127.0.0.11): names are resolved by the proxy only (packet filter)",
    "sf:direct": "a direct connection, not through the proxy (packet filter)",
    "sf:v6": "IPv6 is not allowed (packet filter)",
}
_NETLINK_NETFILTER = 12
_NFNL_SUBSYS_ULOG = 4
_NFULNL_MSG_PACKET = 0
_NFULNL_MSG_CONFIG = 1
_NFULA_CFG_CMD = 1
_NFULA_CFG_MODE = 2
_NFULA_CFG_QTHRESH = 5
_NFULNL_CFG_CMD_BIND = 1
_NFULNL_COPY_PACKET = 2
_NFULA_PAYLOAD = 9
_NFULA_PREFIX = 10
_NLMSG_ERROR = 2
_NLM_F_REQUEST = 1
_NLM_F_ACK = 4
_PROTOCOLS = {1: "icmp", 6: "tcp", 17: "udp", 58: "icmpv6", 132: "sctp"}


class FilterLogError(OSError):
    """The sandbox's NFLOG group cannot be read (the caller refuses the sandbox)."""


def _attr(kind: int, value: bytes) -> bytes:
    body = struct.pack("=HH", 4 + len(value), kind) + value
    return body + b"\0" * (-len(body) % 4)


def _config_message(group: int, attrs: bytes, seq: int) -> bytes:
    kind = (_NFNL_SUBSYS_ULOG << 8) | _NFULNL_MSG_CONFIG
    body = struct.pack("!BBH", socket.AF_UNSPEC, 0, group) + attrs
    return struct.pack("=IHHII", 16 + len(body), kind, _NLM_F_REQUEST | _NLM_F_ACK, seq, 0) + body


def _request(sock: socket.socket, message: bytes, seq: int) -> None:
    """Send one configuration message and wait for its acknowledgement (an errno of 0)."""
    sock.send(message)
    while True:
        data = sock.recv(65536)
        for kind, msg_seq, payload in _messages(data):
            if kind == _NLMSG_ERROR and msg_seq == seq:
                code = -struct.unpack("=i", payload[:4])[0]
                if code:
                    raise OSError(code, f"NFLOG configuration refused: {os.strerror(code)}")
                return


def _bound_socket(group: int) -> socket.socket:
    sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, _NETLINK_NETFILTER)
    try:
        sock.settimeout(5.0)
        sock.bind((0, 0))
        try:
            sock.setsockopt(socket.SOL_SOCKET, 33, RCVBUF)  # SO_RCVBUFFORCE (root)
        except OSError:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, RCVBUF)
        _request(sock, _config_message(group, _attr(_NFULA_CFG_CMD, bytes([_NFULNL_CFG_CMD_BIND])), 1), 1)
        mode = struct.pack("!IBB", NFLOG_SIZE, _NFULNL_COPY_PACKET, 0)
        qthresh = struct.pack("!I", 1)  # hand each packet over at once, not in batches
        _request(
            sock,
            _config_message(group, _attr(_NFULA_CFG_MODE, mode) + _attr(_NFULA_CFG_QTHRESH, qthresh), 2),
            2,
        )
        sock.setblocking(False)
        return sock
    except BaseException:
        sock.close()
        raise


def _messages(data: bytes) -> list[tuple[int, int, bytes]]:
    """Netlink messages of one datagram: (type, seq, payload after the header)."""
    found = []
    at = 0
    while at + 16 <= len(data):
        length, kind, _flags, seq, _pid = struct.unpack_from("=IHHII", data, at)
        if length < 16:
            break
        found.append((kind, seq, data[at + 16 : at + length]))
        at += (length + 3) & ~3
    return found


def _attributes(data: bytes) -> dict[int, bytes]:
    attrs: dict[int, bytes] = {}
    at = 0
    while at + 4 <= len(data):
        length, kind = struct.unpack_from("=HH", data, at)
        if length < 4:
            break
        attrs[kind & 0x3FFF] = data[at + 4 : at + length]
        at += (length + 3) & ~3
    return attrs


@dataclass(frozen=True)
class LoggedPacket:
    """One packet the filter refused: where it went and why (the rule's prefix)."""

    prefix: str
    protocol: str
    host: str
    port: int


def parse_packet(payload: bytes) -> LoggedPacket | None:
    """A NFULNL_MSG_PACKET's payload (nfgenmsg + attributes) -> its packet, None if unreadable."""
    attrs = _attributes(payload[4:])
    packet = attrs.get(_NFULA_PAYLOAD, b"")
    prefix = attrs.get(_NFULA_PREFIX, b"").split(b"\0", 1)[0].decode(errors="replace")
    if not packet:
        return None
    version = packet[0] >> 4
    if version == 4 and len(packet) >= 20:
        header = (packet[0] & 0x0F) * 4
        number, host = packet[9], str(ipaddress.IPv4Address(packet[16:20]))
    elif version == 6 and len(packet) >= 40:
        header, number, host = 40, packet[6], str(ipaddress.IPv6Address(packet[24:40]))
    else:
        return None
    port = 0
    if number in (6, 17, 132) and len(packet) >= header + 4:
        port = struct.unpack_from("!H", packet, header + 2)[0]
    return LoggedPacket(prefix, _PROTOCOLS.get(number, str(number)), host, port)


@dataclass
class FilterLog:
    """The NFLOG socket of one sandbox's network namespace."""

    sock: socket.socket
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    @classmethod
    def open(cls, netns: SandboxNetns, group: int = NFLOG_GROUP) -> FilterLog:
        """Bind ``group`` in the sandbox's namespace.

        Raises:
            FilterLogError: the namespace cannot be entered or the group cannot be bound.
        """
        try:
            return cls(netns.call(lambda: _bound_socket(group), name="sandfleet-nflog"))
        except NetnsError as e:
            raise FilterLogError(f"cannot read the sandbox filter's log (NFLOG group {group}): {e}") from None

    def take(self) -> list[dict[str, Any]]:
        """The refusals logged since the last call, merged: one entry per (reason, protocol, host,
        port) with its count, in order of first appearance. Messages the kernel dropped (ENOBUFS)
        are missing here and counted by the filter's rules."""
        merged: dict[tuple[str, str, str, int], dict[str, Any]] = {}
        with self._lock:
            while True:
                try:
                    data = self.sock.recv(65536)
                except BlockingIOError:
                    break
                except OSError as e:
                    if e.errno == 105:  # ENOBUFS: the kernel dropped messages; the socket goes on
                        continue
                    break  # closed
                for kind, _seq, payload in _messages(data):
                    if kind != (_NFNL_SUBSYS_ULOG << 8) | _NFULNL_MSG_PACKET:
                        continue
                    packet = parse_packet(payload)
                    if packet is not None:
                        _merge(merged, packet)
        return list(merged.values())

    def close(self) -> None:
        with self._lock:
            self.sock.close()


def _merge(merged: dict[tuple[str, str, str, int], dict[str, Any]], packet: LoggedPacket) -> None:
    reason = REASONS.get(packet.prefix, f"refused by the packet filter ({packet.prefix})")
    key = (reason, packet.protocol, packet.host, packet.port)
    entry = merged.setdefault(
        key,
        {"host": packet.host, "port": packet.port, "reason": reason, "protocol": packet.protocol, "count": 0},
    )
    entry["count"] += 1


def nflog_rule(prefix: str, match: str = "") -> str:
    """The NFLOG rule before a REJECT, in ``iptables -S`` form (the filter is verified against it)."""
    lead = f"-A OUTPUT {match} " if match else "-A OUTPUT "
    return (
        f"{lead}-m limit --limit {LIMIT} --limit-burst {BURST} -j NFLOG "
        f'--nflog-prefix "{prefix}" --nflog-group {NFLOG_GROUP} --nflog-size {NFLOG_SIZE}'
    )
