"""Allow-list entries of network "restricted": parsing, matching and narrowing. Standard library only.

An entry is a host name, or ``*.suffix`` (every name below the suffix, not the suffix itself), with
an optional ``:port`` (default 443). Names only: IP literals, ``*`` alone and wildcards of a top-level
domain (``*.com``) are refused. This module is also copied next to the proxy's helper
(sandfleet/worker/egress/helper.py), which imports it as ``allowlist`` to decide each connection with the same rules.
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass

DEFAULT_PORT = 443
MAX_ENTRIES = 256
_LABEL = re.compile(r"^[a-z0-9_](?:[a-z0-9_-]{0,61}[a-z0-9_])?$")
EXAMPLES = "e.g. 'pypi.org', '*.pythonhosted.org' or 'api.example.com:8443'"


class AllowListError(ValueError):
    """A malformed allow-list entry; the message says which and what is accepted."""


@dataclass(frozen=True, order=True)
class HostRule:
    """One allow-list entry: ``name`` (lower case, no trailing dot), wildcard or not, one port."""

    name: str
    port: int = DEFAULT_PORT
    wildcard: bool = False

    def __str__(self) -> str:
        text = f"*.{self.name}" if self.wildcard else self.name
        return text if self.port == DEFAULT_PORT else f"{text}:{self.port}"

    def matches(self, host: str, port: int) -> bool:
        """Whether a connection to ``host`` (a normalised name) on ``port`` is allowed by this entry."""
        if port != self.port:
            return False
        return host.endswith("." + self.name) if self.wildcard else host == self.name

    def covers(self, other: HostRule) -> bool:
        """Whether every connection ``other`` allows is allowed by this entry too (policy narrowing)."""
        if other.port != self.port:
            return False
        if not self.wildcard:
            return not other.wildcard and other.name == self.name
        return other.name.endswith("." + self.name) or (other.wildcard and other.name == self.name)


def normalise_host(host: str) -> str:
    """A host name as matched: lower case, no trailing dot, IDNA (punycode) for non-ASCII names."""
    host = host.strip().rstrip(".").lower()
    if host and not host.isascii():
        host = host.encode("idna").decode("ascii")
    return host


def is_ip_literal(host: str) -> bool:
    text = host.strip("[]")
    try:
        ipaddress.ip_address(text)
    except ValueError:
        # inet_aton accepts forms ip_address does not (0x7f.1, 2130706433): a name never is all digits
        return bool(re.fullmatch(r"[0-9.x]+", text)) and any(c.isdigit() for c in text)
    return True


def parse_rule(entry: str) -> HostRule:
    """One entry as a HostRule.

    Raises:
        AllowListError: the entry is not a name (or ``*.suffix``) with an optional port.
    """
    if not isinstance(entry, str) or not entry.strip():
        raise AllowListError(f"allow_hosts entries are host names ({EXAMPLES}), got {entry!r}")
    text = entry.strip()
    if "://" in text or "/" in text:
        raise AllowListError(f"allow_hosts entry {entry!r}: give a host name, not a URL ({EXAMPLES})")
    port = DEFAULT_PORT
    host = text
    if text.startswith("["):
        raise AllowListError(f"allow_hosts entry {entry!r}: IP addresses are not allowed, only names")
    if ":" in text:
        host, _, port_text = text.rpartition(":")
        if ":" in host:
            raise AllowListError(f"allow_hosts entry {entry!r}: IP addresses are not allowed, only names")
        if not port_text.isdigit() or not 1 <= int(port_text) <= 65535:
            raise AllowListError(f"allow_hosts entry {entry!r}: the port must be 1-65535, got {port_text!r}")
        port = int(port_text)
    wildcard = host.startswith("*.")
    name = normalise_host(host[2:] if wildcard else host)
    if "*" in name:
        raise AllowListError(
            f"allow_hosts entry {entry!r}: a wildcard is only allowed as the first label ('*.example.com')"
        )
    if is_ip_literal(name):
        raise AllowListError(f"allow_hosts entry {entry!r}: IP addresses are not allowed, only names")
    labels = name.split(".")
    if not name or len(name) > 253 or not all(_LABEL.match(label) for label in labels):
        raise AllowListError(f"allow_hosts entry {entry!r} is not a valid host name ({EXAMPLES})")
    if wildcard and len(labels) < 2:
        raise AllowListError(
            f"allow_hosts entry {entry!r}: a wildcard of a top-level domain is too wide; name the domain "
            "('*.example.com')"
        )
    return HostRule(name=name, port=port, wildcard=wildcard)


def parse_rules(entries: list[str] | tuple[str, ...]) -> tuple[HostRule, ...]:
    """Every entry parsed, duplicates dropped, in a stable order."""
    if len(entries) > MAX_ENTRIES:
        raise AllowListError(f"allow_hosts has {len(entries)} entries; the limit is {MAX_ENTRIES}")
    return tuple(sorted({parse_rule(entry) for entry in entries}))


def decide(rules: tuple[HostRule, ...], host: str, port: int) -> str | None:
    """Why a connection to ``host``:``port`` is refused under ``rules``; None when it is allowed."""
    if not host or host == "-":
        return "no host name"
    if is_ip_literal(host):
        return "IP addresses are not allowed, only names"
    name = normalise_host(host)
    if any(rule.matches(name, port) for rule in rules):
        return None
    if any(rule.matches(name, rule.port) for rule in rules):
        ports = sorted({rule.port for rule in rules if rule.matches(name, rule.port)})
        return f"port {port} is not allowed for this name (allowed: {', '.join(map(str, ports))})"
    return "the name is not in the allow-list"


def uncovered(job: tuple[HostRule, ...], policy: tuple[HostRule, ...]) -> list[HostRule]:
    """The job's entries that no entry of the operator's policy covers (jobs may only narrow)."""
    return [rule for rule in job if not any(widest.covers(rule) for widest in policy)]
