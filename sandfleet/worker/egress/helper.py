"""Squid's external ACL helper: decides each connection of a sandbox against its own allow-list.

Run by Squid (as its unprivileged user), one line in, one line out (Squid's helper protocol,
``concurrency=0``): ``connect`` mode gets ``client-ip method host port`` when a request arrives (a
CONNECT's target, or a plain HTTP request's host), ``sni`` mode gets ``client-ip host port sni``
after Squid has peeked at the TLS ClientHello. The allow-list is the file ``clients/<client-ip>``
the worker wrote when it started that sandbox (no file: refused). Every refusal is appended to
``denials/<sandbox>.jsonl`` before the answer goes back, so the worker reads it as soon as the
program sees its error. ``destination`` mode is asked only when a ``dst`` ACL matched (the name
resolves to an internal address, destinations.py): it records that refusal and always answers OK
(the deny rule then matches). ``log`` mode is Squid's logfile_daemon: it reads every transaction's
outcome and records the connections to a refused range that the host's kernel stopped. Standard
library only; copied with allowlist.py and destinations.py into the proxy's folder.
"""

from __future__ import annotations

import json
import os
import sys
import time
import urllib.parse
from collections.abc import Iterable

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import allowlist
import destinations

_cache: dict[str, tuple[int, dict, tuple]] = {}


def client(state: str, ip: str) -> tuple[dict, tuple] | None:
    """The sandbox's registration and parsed rules for a source address, None if it has none."""
    if not ip or "/" in ip or ip.startswith("."):
        return None
    path = os.path.join(state, "clients", ip)
    try:
        stamp = os.stat(path).st_mtime_ns
    except OSError:
        _cache.pop(ip, None)
        return None
    cached = _cache.get(ip)
    if cached and cached[0] == stamp:
        return cached[1], cached[2]
    try:
        with open(path) as f:
            entry = json.load(f)
        rules = allowlist.parse_rules(entry["allow"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    _cache[ip] = (stamp, entry, rules)
    return entry, rules


def record(state: str, entry: dict | None, ip: str, denial: dict) -> None:
    """Append one refusal to the sandbox's denial file (or the unknown-clients file)."""
    name = entry.get("sandbox", "unknown") if entry else "unknown"
    line = json.dumps({"time": round(time.time(), 3), "client": ip, **denial}, sort_keys=True) + "\n"
    fd = os.open(
        os.path.join(state, "denials", f"{name}.jsonl"), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644
    )
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)


def answer(state: str, mode: str, fields: list[str]) -> str:
    """The reply to one request line: ``OK`` or ``ERR message="..."``."""
    fields = [urllib.parse.unquote(f) for f in fields]
    if mode == "connect":
        ip, method, host, port_text = (fields + ["-"] * 4)[:4]
        sni = None
    else:
        ip, host, port_text, sni = (fields + ["-"] * 4)[:4]
        method = "CONNECT"
    try:
        port = int(port_text)
    except ValueError:
        port = 0
    found = client(state, ip)
    entry, rules = found if found else (None, ())
    reason = None if found else "this address has no allow-list (not a sandbox of this worker host)"
    if reason is None:
        reason = allowlist.decide(rules, host, port)
    if reason is None and mode == "sni":
        if not sni or sni == "-":
            reason = "the TLS ClientHello names no server (SNI): names are required"
        elif allowlist.normalise_host(sni) != allowlist.normalise_host(host):
            reason = f"the TLS server name {sni!r} does not match the CONNECT target {host!r}"
    if reason is None:
        return "OK"
    denial = {"host": host, "port": port, "reason": reason, "method": method}
    if sni and sni != "-":
        denial["sni"] = sni
    try:
        record(state, entry, ip, denial)
    except OSError as e:  # the refusal stands; say why it was not recorded
        reason += f" (not recorded: {e.strerror})"
    text = f"sandfleet egress refused {host}:{port}: {reason}".replace('"', "'")
    return f'ERR message="{text}"'


def destination(state: str, fields: list[str]) -> str:
    """A ``dst`` ACL matched: record the refusal under its category's reason; always OK."""
    ip, method, host, port_text, key = ([urllib.parse.unquote(f) for f in fields] + ["-"] * 5)[:5]
    if key not in destinations.CATEGORIES:
        key = "special"
    found = client(state, ip)
    reason = destinations.reason(key)
    denial = {"host": host, "port": int(port_text) if port_text.isdigit() else 0, "reason": reason}
    denial["method"] = method
    try:
        record(state, found[0] if found else None, ip, denial)
    except OSError as e:
        reason += f" (not recorded: {e.strerror})"
    text = f"sandfleet egress refused {host}:{port_text}: {reason}".replace('"', "'")
    return f'OK message="{text}"'


def log_outcomes(state: str, lines: Iterable[str]) -> None:
    """Squid's logfile_daemon protocol: ``L<entry>`` lines (``sf_outcome``: client-ip method host
    port server-ip error status); other commands (rotate, flush...) need nothing of a log that keeps
    nothing. A failed connection shows as ERR_CONNECT_FAIL, or for a spliced CONNECT as status 503."""
    with open(os.path.join(state, "destinations.json")) as f:
        denied = destinations.DeniedRanges.from_json(f.read())
    for line in lines:
        if not line.startswith("L"):
            continue
        try:
            ip, method, host, port_text, server, error, status = line[1:].split()[:7]
            failed = error == "ERR_CONNECT_FAIL" or status == "503"
            key = denied.category_of(server) if failed and server != "-" else None
            if key is None:
                continue
            found = client(state, ip)
            denial = {"host": host, "port": int(port_text), "method": method}
            denial["reason"] = destinations.filter_reason(server, key)
            record(state, found[0] if found else None, ip, denial)
        except Exception:  # never let a line stop the log: Squid stops when its log daemon dies
            continue


def main() -> None:
    state, mode = sys.argv[1], sys.argv[2]
    if mode == "log":
        log_outcomes(state, sys.stdin)
        return
    for line in sys.stdin:
        try:
            if mode == "destination":
                reply = destination(state, line.split())
            else:
                reply = answer(state, mode, line.split())
        except Exception as e:  # never let a bad line kill the helper: refuse it
            reply = f'ERR message="sandfleet egress helper error: {type(e).__name__}"'
        sys.stdout.write(reply + "\n")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
