"""Which completion-webhook URLs a job spec may name: absolute http(s) URLs with a host, nothing else.

A pure check, shared by the producer (refused before anything is enqueued) and the contracts.
"""

from __future__ import annotations

from urllib.parse import urlsplit

MAX_WEBHOOK_URL_CHARS = 2000


def check_webhook_url(url: str) -> str:
    """``url`` when it is an absolute http(s) URL with a host; ValueError saying what is wrong otherwise."""
    if len(url) > MAX_WEBHOOK_URL_CHARS:
        raise ValueError(f"webhook URL has {len(url)} characters; the limit is {MAX_WEBHOOK_URL_CHARS}")
    if any(c.isspace() for c in url):
        raise ValueError(f"webhook URL must not contain spaces, got {url!r}")
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"webhook must be an http:// or https:// URL with a host, got {url!r}")
    if parts.username or parts.password:
        raise ValueError("webhook URL must not carry credentials (the POST is signed instead)")
    return url


def webhook_host_allowed(url: str, patterns: list[str]) -> bool:
    """Whether ``url``'s host (and port) is in the operator's list (``SANDFLEET_POLICY_WEBHOOK_HOSTS``).

    Entries are names or addresses, ``*.suffix`` wildcards, each with an optional ``:port`` (without
    one, any port). An empty list allows nothing: a job cannot make a worker POST to an address the
    operator did not name (its own Redis, a metadata service).
    """
    parts = urlsplit(url)
    host = (parts.hostname or "").lower().rstrip(".")
    port = parts.port or (443 if parts.scheme == "https" else 80)
    for pattern in patterns:
        name, _, want_port = (
            pattern.strip().lower().rpartition(":")
            if _has_port(pattern)
            else (pattern.strip().lower(), "", "")
        )
        if want_port and int(want_port) != port:
            continue
        if name.startswith("*."):
            if host.endswith(name[1:]) and host != name[2:]:
                return True
        elif host == name.strip("[]"):
            return True
    return False


def _has_port(pattern: str) -> bool:
    """``host:port`` or ``[v6]:port`` (a bare IPv6 address has colons but no port)."""
    head, sep, tail = pattern.rpartition(":")
    return bool(sep) and tail.isdigit() and (head.endswith("]") or ":" not in head)
