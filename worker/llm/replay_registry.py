"""The replay servers this process started for ``replay:FILE`` model names: one per script, reused.

A model named ``replay:FILE`` (or ``replay:FILE?latency=SECONDS``) needs a replay server; the first
job that names it starts one on 127.0.0.1 with a free port, in a daemon thread, and every later job in
the process reuses it. Servers are keyed by the script's resolved path and the latency, so
``replay:a.yaml`` and ``replay:a.yaml?latency=1`` are two servers. The script is read once, when its
server starts; the rule counters of ``fail_first`` therefore live as long as the process.
"""

from __future__ import annotations

import atexit
import threading
from pathlib import Path
from urllib.parse import parse_qs

from sandfleet.core.errors import InvalidSpecError
from sandfleet.worker.llm.replay_server import ReplayServer

REPLAY_HOST = "127.0.0.1"
_QUERY_KEYS = ("latency",)

_lock = threading.Lock()
_servers: dict[tuple[Path, float], ReplayServer] = {}


def parse_replay_spec(spec: str) -> tuple[Path, float]:
    """Split the part after ``replay:`` into the script path and the server-wide latency (seconds).

    Raises:
        InvalidSpecError: no file, an unknown query key, or a latency that is not a number >= 0.
    """
    file_part, _, query = spec.partition("?")
    if not file_part:
        raise InvalidSpecError(
            "a replay model needs a script file: replay:FILE or replay:FILE?latency=SECONDS"
        )
    latency_s = 0.0
    for key, values in parse_qs(query, keep_blank_values=True).items():
        if key not in _QUERY_KEYS:
            raise InvalidSpecError(f"replay:{spec}: unknown option {key!r} (known: {', '.join(_QUERY_KEYS)})")
        try:
            latency_s = float(values[-1])
        except ValueError:
            latency_s = -1.0
        if not latency_s >= 0:  # also refuses nan
            raise InvalidSpecError(
                f"replay:{spec}: latency must be a number of seconds >= 0, got {values[-1]!r}"
            )
    return Path(file_part).expanduser().resolve(), latency_s


def shared_replay_server(spec: str) -> ReplayServer:
    """The started replay server for ``spec`` (the part after ``replay:``), starting it if needed.

    Raises:
        InvalidSpecError: a bad spec, or a missing or malformed script.
    """
    key = parse_replay_spec(spec)
    with _lock:
        server = _servers.get(key)
        if server is None:
            path, latency_s = key
            server = ReplayServer.from_file(path, host=REPLAY_HOST, port=0, latency_s=latency_s)
            server.start()
            _servers[key] = server
        return server


@atexit.register
def stop_shared_replay_servers() -> None:
    """Stop every server started here (at exit, or in a test that wants a fresh start)."""
    with _lock:
        servers = list(_servers.values())
        _servers.clear()
    for server in servers:
        server.stop()
