"""Where the egress proxy may connect: the Internet, never this machine, its networks or the ranges
that are not the Internet, unless the operator lists them (SANDFLEET_EGRESS_ALLOW_DESTINATIONS).

An allowed name is only a name: its DNS answer (or the proxy's hosts file) may point at 127.0.0.1,
at a cloud's metadata service on 169.254.169.254, at the worker host's Redis or at another
container. The refused ranges come in categories, each with the reason a refusal records:
loopback, link-local, private (RFC 1918, unique local), shared (carrier-grade NAT), the other
special-purpose blocks of IANA's registries (unspecified, documentation, benchmarking, multicast,
broadcast, reserved, 6to4 and Teredo, which embed IPv4 addresses, NAT64's local prefix), the NAT64
form (64:ff9b::/96) of every refused IPv4 range, and "fleet": the worker host's own addresses and
its Docker networks where no other category covers them (a host's public address). The operator's
CIDRs are cut out of every category.

Enforced twice. Squid's ``dst`` ACLs (squid.py) refuse a request when *any* address of the name's
answer (A and AAAA) is in a refused range, before any connection: a plain HTTP request with a 403,
a CONNECT before its "200"; the refusal is recorded with its reason. Squid keeps IPv4 addresses as
IPv4-mapped IPv6 internally, so 127.0.0.0/8 also matches ::ffff:127.0.0.1 (an explicit
::ffff:0:0/96 entry would match every IPv4 address: none is written). But the ACL and the
connection are two lookups of Squid's cache: when the answer expires in between (at least
negative_dns_ttl, 60 s, after the lookup, and a program decides how long to wait between its
CONNECT and its ClientHello), Squid resolves the name again for the connection, and a changed answer
(DNS rebinding) is not checked by the ACL again (``dst`` does not look a name up twice for one
request). So the host's kernel (network.py) refuses the proxy's own connections, marked by Squid
(``tcp_outgoing_mark``), to the same ranges and to every address of the host (``addrtype LOCAL``,
which follows interfaces as they come and go); the helper's log mode records such a refusal from
Squid's log (the connection failed, to which address).
"""

from __future__ import annotations

import ipaddress
import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network

# key -> (what a refusal says the name resolved to, the ranges). Order matters: an address is
# reported in the first category that holds it.
CATEGORIES: dict[str, tuple[str, tuple[str, ...]]] = {
    "loopback": ("a loopback address", ("127.0.0.0/8", "::1/128")),
    "link-local": ("a link-local address (where cloud metadata services answer)", ("169.254.0.0/16", "fe80::/10")),
    "private": (
        "a private address",
        ("10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "fc00::/7", "fec0::/10"),
    ),
    "shared": ("a shared (carrier-grade NAT) address", ("100.64.0.0/10",)),
    "special": (
        "a special-purpose address (unspecified, documentation, benchmarking, multicast, broadcast or reserved)",
        (
            "0.0.0.0/8", "192.0.0.0/24", "192.0.2.0/24", "192.88.99.0/24", "198.18.0.0/15",
            "198.51.100.0/24", "203.0.113.0/24", "224.0.0.0/4", "240.0.0.0/4",
            "::/96", "64:ff9b:1::/48", "100::/64", "2001::/23", "2001:db8::/32", "2002::/16",
            "3fff::/20", "ff00::/8",
        ),
    ),
    "fleet": ("an address of the worker host or of its Docker networks", ()),
}  # fmt: skip
NAT64 = ipaddress.IPv6Network("64:ff9b::/96")
RULE = "destination rule"  # how every refusal names the mechanism


def parse_networks(entries: Iterable[str]) -> list[IPNetwork]:
    """CIDRs (or single addresses) as networks.

    Raises:
        ValueError: an entry is not an address or a CIDR with its host bits clear; the message
            names it and the fix.
    """
    networks: list[IPNetwork] = []
    for entry in entries:
        try:
            networks.append(ipaddress.ip_network(entry.strip(), strict=True))
        except ValueError as e:
            hint = ""
            try:
                hint = f"; did you mean {ipaddress.ip_network(entry.strip(), strict=False)}?"
            except ValueError:
                pass
            raise ValueError(
                f"{entry!r} is not an IP address or CIDR (e.g. 10.20.0.0/16, 192.168.1.5, fd00::/8): {e}{hint}"
            ) from None
    return networks


def _without(networks: Iterable[IPNetwork], cut: Sequence[IPNetwork]) -> list[IPNetwork]:
    """``networks`` with every address of ``cut`` taken out, collapsed."""
    left = list(networks)
    for hole in cut:
        kept: list[IPNetwork] = []
        for net in left:
            if net.version != hole.version or not net.overlaps(hole):
                kept.append(net)
            elif not hole.supernet_of(net):  # type: ignore[arg-type]  # same version here
                kept.extend(net.address_exclude(hole))  # type: ignore[arg-type]
        left = kept
    v4 = [n for n in left if isinstance(n, ipaddress.IPv4Network)]
    v6 = [n for n in left if isinstance(n, ipaddress.IPv6Network)]
    return [*ipaddress.collapse_addresses(v4), *ipaddress.collapse_addresses(v6)]


def _nat64(net: ipaddress.IPv4Network) -> ipaddress.IPv6Network:
    base = int(NAT64.network_address) | int(net.network_address)
    return ipaddress.IPv6Network((base, 96 + net.prefixlen))


@dataclass(frozen=True)
class DeniedRanges:
    """The ranges the proxy refuses, by category, with the operator's exceptions cut out."""

    categories: tuple[tuple[str, tuple[IPNetwork, ...]], ...]
    allowed: tuple[IPNetwork, ...] = ()

    @classmethod
    def build(cls, allowed: Sequence[IPNetwork] = (), fleet: Iterable[IPNetwork] = ()) -> DeniedRanges:
        """The refused ranges: every category minus ``allowed``; ``fleet`` (the host's addresses and
        Docker subnets) where no other category covers them already (so that a new Docker network
        in a private range changes nothing, and the proxy is not restarted for it)."""
        static = {key: parse_networks(nets) for key, (_label, nets) in CATEGORIES.items()}
        v4_refused = [n for nets in static.values() for n in nets if isinstance(n, ipaddress.IPv4Network)]
        static["special"] += [_nat64(n) for n in v4_refused]
        covered = [n for nets in static.values() for n in nets]
        static["fleet"] = [
            n
            for n in fleet
            if not any(n.version == c.version and c.supernet_of(n) for c in covered)  # type: ignore[arg-type]
        ]
        categories = tuple((key, tuple(_without(nets, allowed))) for key, nets in static.items())
        return cls(tuple((k, nets) for k, nets in categories if nets), tuple(allowed))

    def networks(self, version: int | None = None) -> list[IPNetwork]:
        return [n for _k, nets in self.categories for n in nets if version in (None, n.version)]

    def category_of(self, address: str) -> str | None:
        """The first category holding ``address`` (IPv4-mapped IPv6 counts as its IPv4), None if allowed."""
        ip = ipaddress.ip_address(address.strip("[]"))
        if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
            ip = ip.ipv4_mapped
        for key, nets in self.categories:
            if any(ip in net for net in nets):
                return key
        return None

    def squid_acls(self) -> list[str]:
        """One ``dst`` ACL per category (``sf_dst_<key>``) and the helper's note of its refusal
        (``sf_dst_<key>_refused``, an external ACL that records it and always matches)."""
        lines = []
        for key, nets in self.categories:
            name = acl_name(key)
            lines.append(f"acl {name} dst {' '.join(map(str, nets))}")
            lines.append(f"acl {name}_refused external sf_destination {key}")
        return lines

    def squid_refusal_acls(self) -> list[str]:
        return [f"{acl_name(key)}_refused" for key, _nets in self.categories]

    def squid_refusals(self, prefix: str) -> list[str]:
        """``prefix`` (``http_access deny !CONNECT``, ``ssl_bump terminate step1``) per category."""
        return [f"{prefix} {acl_name(key)} {acl_name(key)}_refused" for key, _nets in self.categories]

    def to_json(self) -> str:
        """The proxy folder's destinations.json, read back by its helper (``from_json``)."""
        categories = {key: [str(n) for n in nets] for key, nets in self.categories}
        return json.dumps({"categories": categories, "allowed": [str(n) for n in self.allowed]}, indent=1)

    @classmethod
    def from_json(cls, text: str) -> DeniedRanges:
        data = json.loads(text)
        categories = tuple((key, tuple(parse_networks(nets))) for key, nets in data["categories"].items())
        return cls(categories, tuple(parse_networks(data["allowed"])))


def acl_name(key: str) -> str:
    return "sf_dst_" + key.replace("-", "_")


def label(key: str) -> str:
    return CATEGORIES[key][0]


def reason(key: str) -> str:
    """What the run's record says of a refusal by the proxy's destination rule."""
    return f"the name resolves to {label(key)}: internal addresses are refused ({RULE})"


def filter_reason(address: str, key: str) -> str:
    """What it says when the host's kernel refused the proxy's connection (the name's address
    changed after the destination rule passed it, or the host gained an address since)."""
    return (
        f"the proxy's connection to {address} ({label(key)}) was refused by the host's destination filter "
        f"({RULE}: the address differed from the one the proxy checked)"
    )
