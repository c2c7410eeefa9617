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
