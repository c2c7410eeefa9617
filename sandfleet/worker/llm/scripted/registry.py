"""The replay servers this process started for ``replay:FILE`` model names: one per script, reused.

A model named ``replay:FILE`` (or ``replay:FILE?latency=SECONDS``) needs a replay server; the first
job that names a script starts one on 127.0.0.1 with a free port, in a daemon thread, and every later
job in the process reuses it. Servers are keyed by the script's real path only: the latency is not the
server's but each request's (the client sends it in a header, ``REPLAY_LATENCY_HEADER``), so
``replay:a.yaml`` and ``replay:a.yaml?latency=1`` share one server and its ``fail_first`` counters,
and no choice of options in a job starts another thread or opens another port. The number of servers
is bounded by the scripts there are: for a worker, the files in ``SANDFLEET_REPLAY_SCRIPTS_DIR``.

Which file a name may reach depends on who named it (``ModelTrust``, sandfleet/worker/llm/scripted/access.py);
that is checked on every lookup, before an existing server is reused. The script is read once, when
its server starts; the rule counters of ``fail_first`` therefore live as long as the process.
"""

from __future__ import annotations

import atexit
import math
import threading
from collections.abc import Callable
from pathlib import Path
from urllib.parse import parse_qs

from sandfleet.core.errors import InvalidSpecError
from sandfleet.worker.llm.scripted.access import ModelTrust, read_confined_script
from sandfleet.worker.llm.scripted.script import ReplayScript, load_script
from sandfleet.worker.llm.scripted.server import MAX_REQUEST_LATENCY_S, ReplayServer

REPLAY_HOST = "127.0.0.1"
_QUERY_KEYS = ("latency",)

_lock = threading.Lock()
_servers: dict[Path, ReplayServer] = {}


def parse_replay_spec(spec: str) -> tuple[str, float | None]:
    """Split the part after ``replay:`` into the script's name (as written) and the latency of each
    reply in seconds (None when not given).

    Raises:
        InvalidSpecError: no file, an unknown query key, or a latency that is not a number from 0 to
            ``MAX_REQUEST_LATENCY_S``.
    """
    file_part, _, query = spec.partition("?")
    if not file_part:
        raise InvalidSpecError(
            "a replay model needs a script file: replay:FILE or replay:FILE?latency=SECONDS"
        )
    latency_s: float | None = None
    for key, values in parse_qs(query, keep_blank_values=True).items():
        if key not in _QUERY_KEYS:
            raise InvalidSpecError(f"replay:{spec}: unknown option {key!r} (known: {', '.join(_QUERY_KEYS)})")
        try:
            latency_s = float(values[-1])
        except ValueError:
            latency_s = math.nan
        if not 0 <= latency_s <= MAX_REQUEST_LATENCY_S:  # also refuses nan
            raise InvalidSpecError(
                f"replay:{spec}: latency must be a number of seconds from 0 to {MAX_REQUEST_LATENCY_S:g}, "
                f"got {values[-1]!r}"
            )
    return file_part, latency_s


def shared_replay_server(name: str, *, trust: ModelTrust, scripts_dir: str | None = None) -> ReplayServer:
    """The started replay server for the script ``name`` (the file part of ``replay:FILE``), starting
    it if needed.

    Args:
        name: the script's file, as the model name wrote it.
        trust: who wrote the name; ``SUBMITTER`` names reach only files inside ``scripts_dir``.
        scripts_dir: the operator's ``SANDFLEET_REPLAY_SCRIPTS_DIR``.

    Raises:
        InvalidSpecError: the script is missing, out of reach or malformed (for a ``SUBMITTER`` name,
            in words that quote neither the file nor the parser).
    """
    if trust is ModelTrust.OPERATOR:
        path = Path(name).expanduser().resolve()
        return _server_for(path, lambda: load_script(path))
    script = read_confined_script(name, scripts_dir)
    return _server_for(script.path, script.parse)


def _server_for(path: Path, load: Callable[[], ReplayScript]) -> ReplayServer:
    with _lock:
        server = _servers.get(path)
        if server is None:
            server = ReplayServer(load(), host=REPLAY_HOST, port=0)
            server.start()
            _servers[path] = server
        return server


@atexit.register
def stop_shared_replay_servers() -> None:
    """Stop every server started here (at exit, or in a test that wants a fresh start)."""
    with _lock:
        servers = list(_servers.values())
        _servers.clear()
    for server in servers:
        server.stop()
