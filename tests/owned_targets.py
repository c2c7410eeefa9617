"""Addresses this test run owns, so that a hostile test never sends anything off the machine.

A hostile test aims at "the Internet", "a cloud's metadata service", "a private network": if its
refusal failed, its packets must arrive here, be counted, and go no further. ``OwnedTargets.start``
(the session fixture ``owned_targets`` of conftest.py) gives this run:

- an interface ``egress<pid>`` carrying one address of each kind, chosen free on this host:
  ``public_v4`` (198.51.100.n), ``public_v4_b`` (203.0.113.n) and ``public_v6`` (2001:db8::n), the
  documentation ranges standing in for the Internet; ``link_local`` (169.254.222.n, the metadata
  service's stand-in: never 169.254.169.254, which this host does not own); ``private`` and
  ``private_b`` (10.222.n.1 and .2), a private network; ``resolver`` (10.222.n.53), free for a DNS
  server of the test's own. Local addresses: the kernel delivers to them, nothing is routed out.
  The interface is a bridge with no ports (the kernels of some hosts have no dummy module): only
  its local addresses matter, which the kernel serves while it is up, carrier or not.
- blackhole routes for 198.51.100.0/24, 203.0.113.0/24 and 2001:db8::/32 (metric 1000000 + pid,
  so runs at the same time each keep their own), so that their other addresses go nowhere either;
- a chain ``egress-seen-<pid>`` at the head of INPUT (iptables and ip6tables) counting every packet
  to a target address, any port, any protocol, from anywhere (a sandbox, Squid, the host), except
  the ICMP "unreachable" errors this host's own REJECT rules send back;
- listeners on the usual ports of each target (TCP accept, UDP receive), recording who came and
  their first bytes: what ``arrivals`` shows beside the packet counts.

Everything is removed by ``stop``, and by the next run's ``start`` if a run died without it (its
interface names a pid that is gone). Needs root and iproute2/iptables.
"""

from __future__ import annotations

import ipaddress
import os
import re
import selectors
import socket
import subprocess
import threading
from dataclasses import dataclass, field
from typing import Any

BLACKHOLES = ("198.51.100.0/24", "203.0.113.0/24", "2001:db8::/32")
METRIC_BASE = 1_000_000
TCP_PORTS = (22, 53, 80, 443, 2375, 3128, 6379, 8000, 8080, 8443)
UDP_PORTS = (53, 123, 443, 3128)
TARGET_KINDS = ("public_v4", "public_v4_b", "public_v6", "link_local", "private", "private_b")
_NAME = re.compile(r"^egress(\d+)$")


def _run(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(list(args), capture_output=True, text=True, timeout=30)
    if check and done.returncode != 0:
        raise RuntimeError(f"{' '.join(args)}: {done.stderr.strip()}")
    return done


def _host_addresses() -> set[str]:
    out = _run("ip", "-o", "addr", "show").stdout
    return {line.split()[3].split("/")[0] for line in out.splitlines() if len(line.split()) > 3}


# The package registries this machine reaches (and its gateway) may themselves sit in a documentation
# range (seen here: pypi.org at 203.0.113.80, the gateway at 192.0.2.1): their addresses are never
# blackholed nor taken as a target, or the test run would cut the machine off its own registries.
REGISTRY_HOSTS = ("pypi.org", "files.pythonhosted.org", "deb.debian.org", "registry.npmjs.org")


def _reached_addresses() -> set[str]:
    """Addresses this machine really talks to: the registries' and the default gateways'."""
    found: set[str] = set()
    for host in REGISTRY_HOSTS:
        try:
            found.update(str(info[4][0]) for info in socket.getaddrinfo(host, 443, proto=socket.IPPROTO_TCP))
        except OSError:
            continue
    for family in ("-4", "-6"):
        for line in _run("ip", family, "route", "show", "default", check=False).stdout.splitlines():
            words = line.split()
            if "via" in words:
                found.add(words[words.index("via") + 1])
    return found


def blackhole_pieces(net: str, keep: set[str]) -> list[str]:
    """``net`` as routes that cover all of it but the addresses in ``keep``."""
    pieces = [ipaddress.ip_network(net)]
    for address in keep:
        try:
            host = ipaddress.ip_network(address)
        except ValueError:
            continue
        next_pieces = []
        for piece in pieces:
            if host.version == piece.version and host.subnet_of(piece):  # type: ignore[arg-type]
                next_pieces.extend(piece.address_exclude(host))  # type: ignore[arg-type]
            else:
                next_pieces.append(piece)
        pieces = next_pieces
    return [str(piece) for piece in sorted(pieces, key=lambda p: (p.version, p))]


@dataclass
class Arrival:
    """Something a listener received: protocol, the target address and port, the sender, first bytes."""

    protocol: str
    address: str
    port: int
    peer: str
    data: bytes = b""


@dataclass
class OwnedTargets:
    """The run's target addresses, their packet counters and listeners."""

    pid: int
    n: int
    public_v4: str
    public_v4_b: str
    public_v6: str
    link_local: str
    private: str
    private_b: str
    resolver: str
    arrived: list[Arrival] = field(default_factory=list)
    _sockets: list[socket.socket] = field(default_factory=list, repr=False)
    _stop: threading.Event = field(default_factory=threading.Event, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    _thread: threading.Thread | None = field(default=None, repr=False)

    @property
    def interface(self) -> str:
        return f"egress{self.pid}"

    @property
    def chain(self) -> str:
        return f"egress-seen-{self.pid}"

    @property
    def metric(self) -> int:
        return METRIC_BASE + self.pid

    @property
    def targets(self) -> dict[str, str]:
        return {kind: getattr(self, kind) for kind in TARGET_KINDS}

    @classmethod
    def start(cls) -> OwnedTargets:
        """Set up this run's interface, routes, counters and listeners (after removing any of a dead run)."""
        remove_stale()
        pid = os.getpid()
        taken = _host_addresses() | _reached_addresses()
        for step in range(250):
            n = 1 + (pid + step) % 250
            candidate = cls._at(pid, n)
            if not ({*candidate.targets.values(), candidate.resolver} & taken):
                break
        else:
            raise RuntimeError("no free address of the test ranges on this host")
        candidate._up()
        return candidate

    @classmethod
    def _at(cls, pid: int, n: int) -> OwnedTargets:
        return cls(
            pid=pid,
            n=n,
            public_v4=f"198.51.100.{n}",
            public_v4_b=f"203.0.113.{n}",
            public_v6=f"2001:db8::{n:x}",
            link_local=f"169.254.222.{n}",
            private=f"10.222.{n}.1",
            private_b=f"10.222.{n}.2",
            resolver=f"10.222.{n}.53",
        )

    def _up(self) -> None:
        try:
            _run("ip", "link", "add", self.interface, "type", "bridge")
            _run("sysctl", "-q", "-w", f"net.ipv6.conf.{self.interface}.disable_ipv6=0", check=False)
            for address in [*self.targets.values(), self.resolver]:
                family = "-6" if ":" in address else "-4"
                bits = "128" if ":" in address else "32"
                extra = ["nodad"] if ":" in address else []
                _run("ip", family, "addr", "add", f"{address}/{bits}", "dev", self.interface, *extra)
            _run("ip", "link", "set", self.interface, "up")
            reached = _reached_addresses()
            for net in BLACKHOLES:
                family = "-6" if ":" in net else "-4"
                for piece in blackhole_pieces(net, reached):
                    _run("ip", family, "route", "add", "blackhole", piece, "metric", str(self.metric))
            for tool, version in (("iptables", 4), ("ip6tables", 6)):
                _run(tool, "-N", self.chain)
                # Not counted: the "unreachable" a REJECT rule of this host sends back to the sender,
                # which for a connection to a local address is that address itself.
                icmp = ["-p", "icmp", "--icmp-type"] if version == 4 else ["-p", "ipv6-icmp", "--icmpv6-type"]
                _run(tool, "-A", self.chain, *icmp, "destination-unreachable", "-j", "RETURN")
                for address in self.targets.values():
                    if ipaddress.ip_address(address).version == version:
                        _run(tool, "-A", self.chain, "-d", address)
                _run(tool, "-I", "INPUT", "1", "-j", self.chain)
            self._listen()
        except BaseException:
            self.stop()
            raise

    def _listen(self) -> None:
        selector = selectors.DefaultSelector()
        for address in self.targets.values():
            family = socket.AF_INET6 if ":" in address else socket.AF_INET
            for kind, ports in ((socket.SOCK_STREAM, TCP_PORTS), (socket.SOCK_DGRAM, UDP_PORTS)):
                for port in ports:
                    sock = socket.socket(family, kind)
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                    try:
                        sock.bind((address, port))
                    except OSError:  # taken by a wildcard listener: the packet counters still see it
                        sock.close()
                        continue
                    if kind == socket.SOCK_STREAM:
                        sock.listen(16)
                    sock.setblocking(False)
                    self._sockets.append(sock)
                    selector.register(sock, selectors.EVENT_READ, (kind, address, port))
        self._thread = threading.Thread(
            target=self._serve, args=(selector,), name="owned-targets", daemon=True
        )
        self._thread.start()

    def _serve(self, selector: selectors.BaseSelector) -> None:
        while not self._stop.is_set():
            for key, _events in selector.select(timeout=0.2):
                kind, address, port = key.data
                sock: socket.socket = key.fileobj  # type: ignore[assignment]
                try:
                    if kind == socket.SOCK_STREAM:
                        conn, peer = sock.accept()
                        conn.settimeout(0.5)
                        try:
                            data = conn.recv(256)
                        except OSError:
                            data = b""
                        conn.close()
                        arrival = Arrival("tcp", address, port, str(peer[0]), data)
                    else:
                        data, peer = sock.recvfrom(2048)
                        arrival = Arrival("udp", address, port, str(peer[0]), data[:256])
                except OSError:
                    continue
                with self._lock:
                    self.arrived.append(arrival)
        selector.close()

    def packets(self) -> dict[str, int]:
        """Packets counted so far per target address (INPUT, any port and protocol)."""
        counts = dict.fromkeys(self.targets.values(), 0)
        for tool in ("iptables", "ip6tables"):
            for line in _run(tool, "-S", self.chain, "-v").stdout.splitlines():
                parts = line.split()
                if line.startswith("-A ") and "-d" in parts and "-c" in parts:
                    address = parts[parts.index("-d") + 1].split("/")[0]
                    counts[str(ipaddress.ip_address(address))] = int(parts[parts.index("-c") + 1])
        return counts

    def mark(self) -> tuple[dict[str, int], int]:
        """A point to compare with later (``arrived_since``)."""
        with self._lock:
            return self.packets(), len(self.arrived)

    def arrived_since(self, mark: tuple[dict[str, int], int]) -> dict[str, Any]:
        """What reached a target after ``mark``: {address: packets}, and the listeners' arrivals.
        Empty (both) when nothing arrived."""
        before, seen = mark
        now = self.packets()
        with self._lock:
            heard = self.arrived[seen:]
        packets = {a: now[a] - before.get(a, 0) for a in now if now[a] != before.get(a, 0)}
        return {"packets": packets, "heard": [vars(a) for a in heard]} if packets or heard else {}

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)
        for sock in self._sockets:
            sock.close()
        self._sockets.clear()
        _remove(self.pid)


def _remove(pid: int) -> None:
    chain = f"egress-seen-{pid}"
    for tool in ("iptables", "ip6tables"):
        _run(tool, "-D", "INPUT", "-j", chain, check=False)
        _run(tool, "-F", chain, check=False)
        _run(tool, "-X", chain, check=False)
    metric = str(METRIC_BASE + pid)
    for family in ("-4", "-6"):  # every piece of the ranges routed with this run's metric
        for line in _run("ip", family, "route", "show", "type", "blackhole", check=False).stdout.splitlines():
            words = line.split()
            if "metric" in words and words[words.index("metric") + 1] == metric:
                _run("ip", family, "route", "del", "blackhole", words[1], "metric", metric, check=False)
    _run("ip", "link", "del", f"egress{pid}", check=False)


def remove_stale() -> None:
    """Remove what runs that died left behind (their interface names a pid that is gone)."""
    for line in _run("ip", "-o", "link", "show", "type", "bridge").stdout.splitlines():
        name = line.split(":")[1].strip().split("@")[0]
        found = _NAME.match(name)
        if found and not os.path.exists(f"/proc/{found.group(1)}"):
            _remove(int(found.group(1)))
