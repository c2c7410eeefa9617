"""Finds and removes what dead processes left behind, and session sandboxes past their lifetime.

A Sandfleet container carries its owner (host, pid, pid start time). On this host, one whose owner
is no longer running is a leftover. A shell job's session sandbox (role ``session``) also carries
the epoch second its lifetime ends (``LABEL_EXPIRES``): past it, it is removed whoever owns it, so a
stuck job cannot keep one alive. gVisor adds another kind: a runsc container whose start
failed can leave its shim, gofer and sandbox processes running, invisible to ``docker ps -a``; those
are found by container id in the process table and killed.
"""

from __future__ import annotations

import logging
import os
import re
import signal
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from sandfleet.worker.sandbox.docker import backend as engine
from sandfleet.worker.sandbox.docker.labels import LABEL_EXPIRES
from sandfleet.worker.sandbox.docker.spec import Owner

log = logging.getLogger("sandfleet.reaper")
_CONTAINER_ID = re.compile(rb"\b[0-9a-f]{64}\b")
STALE_AFTER_S = 60.0
_RUNTIME_PROCESS = re.compile(rb"runsc|containerd-shim")
DEFAULT_EXEC_ROOT = b"/var/run/docker/"
DEFAULT_SOCKETS = ("/var/run/docker.sock", "/run/docker.sock")


@dataclass
class PruneReport:
    removed: list[str] = field(default_factory=list)
    kept: list[str] = field(default_factory=list)
    killed_processes: list[int] = field(default_factory=list)


def prune(
    *, everything: bool = False, owners: set[str] | None = None, client: Any | None = None
) -> PruneReport:
    """Remove Sandfleet containers whose owner is gone, or that sat created or exited for over a minute
    (or, with ``everything``, all of them). Raises SandboxUnavailableError (no engine) or SandboxError.

    ``owners`` restricts removal to containers of those owner labels (a fleet reaper that learnt
    from heartbeats that a worker died). Persistent sandboxes are kept unless ``everything``. Without
    ``owners``, a container past its ``LABEL_EXPIRES`` time (a session sandbox) is removed whoever owns it.
    """
    client = client or engine.docker_client()
    engine.sdk()  # the SDK's errors in engine.DockerError (a client given by the caller)
    report = PruneReport()
    # ignore_removed: the SDK inspects each listed container; others' may be removed meanwhile.
    try:
        listed = client.containers.list(all=True, filters={"label": engine.LABEL_ROLE}, ignore_removed=True)
    except engine.DockerError as e:
        raise engine.translate(e, "list the sandboxes") from e
    for container in listed:
        labels = container.labels or {}
        owner_label = labels.get(engine.LABEL_OWNER, "")
        owner = Owner.parse(owner_label)
        if everything:
            dead = True
        elif owners is not None:
            dead = owner_label in owners
        else:
            dead = expired(labels) or (
                engine.LABEL_PERSISTENT not in labels
                and (owner is None or not owner.is_alive() or _stale(container))
            )
        if not dead:
            report.kept.append(container.id)
            continue
        try:
            container.remove(force=True)
            report.removed.append(container.id)
        except engine.NotFoundError:
            pass
        except engine.DockerError as e:
            log.warning("could not remove %s: %s", container.short_id, e)
    report.killed_processes = kill_orphan_runtime_processes(client)
    return report


def expired(labels: dict[str, str], now: float | None = None) -> bool:
    """Whether a container's ``LABEL_EXPIRES`` time has passed (False without the label or with a bad one)."""
    try:
        expires = float(labels[LABEL_EXPIRES])
    except (KeyError, ValueError):
        return False
    return (time.time() if now is None else now) >= expires


def _stale(container: Any) -> bool:
    """Never started, or already exited, for over STALE_AFTER_S: a sandbox only lives while running.

    Such containers are left when an engine fails between create and start, or kills sandboxes as
    it stops; no owner will ever remove them, alive or not.
    """
    state = container.attrs.get("State", {})
    if state.get("Running") or state.get("Restarting"):
        return False
    stamp = (
        state.get("FinishedAt")
        if state.get("Status") in ("exited", "dead")
        else container.attrs.get("Created")
    )
    when = _parse_time(stamp)
    return when is not None and time.time() - when > STALE_AFTER_S


def _parse_time(stamp: str | None) -> float | None:
    """Epoch seconds from Docker's RFC 3339 time (nanoseconds and all); None for the zero time."""
    if not stamp or stamp.startswith("0001-"):
        return None
    main = stamp.rstrip("Z").split(".")[0]
    try:
        return datetime.strptime(main, "%Y-%m-%dT%H:%M:%S").replace(tzinfo=UTC).timestamp()
    except ValueError:
        return None


def kill_orphan_runtime_processes(client: Any) -> list[int]:
    """Kill runsc/shim processes serving container ids the engine does not know. Root only.

    Only for the local default engine, and only processes under its default exec root
    (``/var/run/docker``): another engine on the same host (a second dockerd with its own exec root)
    runs containers this engine does not know, and those must not be touched. Against any other
    engine the scan is skipped.
    """
    if os.geteuid() != 0 or not _is_default_local_engine(client):
        return []
    # Scan processes before asking the engine: a container created in between is then known.
    candidates: dict[int, set[str]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ")
        except OSError:
            continue
        if not _RUNTIME_PROCESS.search(cmdline.split(b" ", 1)[0]):
            continue
        ids = {m.decode() for m in _CONTAINER_ID.findall(cmdline)}
        if ids and b"moby" in cmdline and DEFAULT_EXEC_ROOT in cmdline:
            candidates[int(entry.name)] = ids
    try:
        known = {c["Id"] for c in client.api.containers(all=True)}
    except engine.DockerError as e:
        raise engine.translate(e, "list the containers") from e
    killed = []
    for pid, ids in candidates.items():
        if not ids & known:
            try:
                os.kill(pid, signal.SIGKILL)
                killed.append(pid)
            except OSError:
                pass
    return killed


def _is_default_local_engine(client: Any) -> bool:
    """True when ``client`` talks to the engine on the default local socket."""
    adapter = getattr(getattr(client, "api", None), "_custom_adapter", None)
    return getattr(adapter, "socket_path", None) in DEFAULT_SOCKETS
