"""Network namespaces, veth links and the processes and cgroups a multi-host fleet leaves: the ``ip``
commands and ``/proc`` scans behind :mod:`sandfleet.fleet.hosts`, in one place.

Every name made here starts with :data:`PREFIX` (``sfh``), so :func:`leftovers` can find what a
killed run left and nothing of anyone else's is touched. Processes enter a namespace with
``nsenter --net=/run/netns/NAME`` rather than ``ip netns exec``: the latter also makes a mount
namespace with a fresh ``/sys``, which hides the cgroup mounts, and dockerd then refuses to start
("Devices cgroup isn't mounted", seen on this host's cgroup v1).
"""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Iterable
from pathlib import Path

PREFIX = "sfh"
NETNS_DIR = Path("/run/netns")
CGROUP_ROOT = Path("/sys/fs/cgroup")
COMMAND_TIMEOUT_S = 30.0


class NamespaceError(RuntimeError):
    """An ``ip`` command failed (its stderr is in the message); the fleet is torn down."""


def ip(*args: str, check: bool = True) -> str:
    """Run ``ip ARGS``; its stdout. Raises NamespaceError with ip's own message when it fails."""
    done = subprocess.run(
        ["ip", *args], capture_output=True, text=True, timeout=COMMAND_TIMEOUT_S, check=False
    )
    if check and done.returncode != 0:
        raise NamespaceError(f"ip {' '.join(args)}: {done.stderr.strip() or done.returncode}")
    return done.stdout


def enter(namespace: str) -> list[str]:
    """The command prefix that runs a program in ``namespace``'s network (and nothing else of it)."""
    return ["nsenter", f"--net={NETNS_DIR / namespace}", "--"]


def add_namespace(name: str) -> None:
    """A new network namespace with its loopback up."""
    ip("netns", "add", name)
    ip("-n", name, "link", "set", "lo", "up")


def delete_namespace(name: str) -> None:
    """Remove the namespace (its veth ends go with it); no error when it is gone already."""
    ip("netns", "delete", name, check=False)


def namespaces(prefix: str = PREFIX) -> list[str]:
    """Names of the network namespaces starting with ``prefix``."""
    names = (line.split()[0] for line in ip("netns", "list", check=False).splitlines() if line.strip())
    return sorted(n for n in names if n.startswith(prefix))


def veth(name: str, namespace: str, peer: str, peer_namespace: str | None) -> None:
    """A veth pair: ``name`` in ``namespace``, ``peer`` in ``peer_namespace`` (None: this one)."""
    ip("link", "add", name, "type", "veth", "peer", "name", peer)
    ip("link", "set", name, "netns", namespace)
    if peer_namespace is not None:
        ip("link", "set", peer, "netns", peer_namespace)


def set_link(namespace: str | None, device: str, up: bool) -> None:
    """Bring a link up or down (``namespace`` None: this namespace)."""
    where = ["-n", namespace] if namespace else []
    ip(*where, "link", "set", device, "up" if up else "down")


def address(namespace: str | None, device: str, cidr: str) -> None:
    """Give ``device`` the address ``cidr`` and bring it up."""
    where = ["-n", namespace] if namespace else []
    ip(*where, "addr", "add", cidr, "dev", device)
    ip(*where, "link", "set", device, "up")


def bridge(namespace: str, name: str, cidr: str) -> None:
    """A bridge in ``namespace`` holding ``cidr`` (the control namespace's one address)."""
    ip("-n", namespace, "link", "add", name, "type", "bridge")
    address(namespace, name, cidr)


def attach(namespace: str, device: str, bridge_name: str) -> None:
    ip("-n", namespace, "link", "set", device, "master", bridge_name, "up")


def root_links(prefix: str = PREFIX) -> list[str]:
    """Links of this namespace whose name starts with ``prefix`` (a killed run's veth ends)."""
    names = (line.split()[0].split("@")[0] for line in ip("-br", "link", check=False).splitlines() if line)
    return sorted(n for n in names if n.startswith(prefix))


def addresses_in_use() -> str:
    """``ip -br addr`` of this namespace (to pick a test range nobody uses)."""
    return ip("-br", "addr", check=False)


def processes_mentioning(needle: str) -> list[int]:
    """Pids whose command line contains ``needle`` (a host's own folder: its dockerd, containerd and
    shims all name it)."""
    found, mine = [], os.getpid()
    wanted = needle.encode()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == mine:
            continue
        try:
            if wanted in (entry / "cmdline").read_bytes():
                found.append(int(entry.name))
        except OSError:
            continue
    return found


def processes_in(namespace: str) -> set[int]:
    """Pids whose network namespace is ``namespace`` (a killed run's Redis and Sentinels, whose
    command lines no longer name its folder: redis-server rewrites its process title)."""
    try:
        wanted = (NETNS_DIR / namespace).stat().st_ino
    except OSError:
        return set()
    found, mine = set(), os.getpid()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == mine:
            continue
        try:
            if (entry / "ns" / "net").stat().st_ino == wanted:
                found.add(int(entry.name))
        except OSError:
            continue
    return found


def cgroup_dirs(name: str) -> list[Path]:
    """The folders of the cgroup ``name`` under the root (a host's cgroup parent): one per controller
    on cgroup v1 (``memory/NAME``, ``pids/NAME``, ...), the one folder ``NAME`` of the unified tree on
    cgroup v2 (its root holds ``cgroup.controllers``)."""
    if (CGROUP_ROOT / "cgroup.controllers").is_file():
        return [CGROUP_ROOT / name] if (CGROUP_ROOT / name).is_dir() else []
    return [d / name for d in CGROUP_ROOT.iterdir() if (d / name).is_dir()]


def cgroup_folders(name: str) -> list[Path]:
    """The cgroup ``name`` and every cgroup below it, in each controller, deepest last.

    Walked with ``os.walk``, which skips a folder that vanishes while it is read: a container's
    cgroup goes away when the container ends, and ``Path.rglob`` raised on one (CI: a host killed
    mid-batch while a job's container was being removed)."""
    return [Path(top) for folder in cgroup_dirs(name) for top, _, _ in os.walk(folder)]


def cgroup_pids(name: str) -> set[int]:
    """Every process in the cgroup ``name`` or below (a host's containers)."""
    pids: set[int] = set()
    for folder in cgroup_folders(name):
        try:
            pids.update(int(p) for p in (folder / "cgroup.procs").read_text().split())
        except OSError:
            continue
    return pids


def kill_all(pids: Iterable[int], sig: int = signal.SIGKILL) -> list[int]:
    """Signal each pid; those that were still there."""
    hit = []
    for pid in pids:
        try:
            os.kill(pid, sig)
            hit.append(pid)
        except ProcessLookupError:
            continue
    return hit


def remove_cgroup(name: str) -> None:
    """Remove the cgroup ``name`` (deepest folders first); what still holds processes stays."""
    for folder in sorted(cgroup_folders(name), key=lambda p: -len(p.parts)):
        _rmdir(folder)


def _rmdir(folder: Path) -> None:
    try:
        folder.rmdir()
    except OSError:
        pass


def unmount_under(folder: Path) -> None:
    """Lazily unmount everything mounted at or below ``folder`` (dockerd mounts its data-root on
    itself and overlay layers below it), deepest first."""
    root = str(folder)
    points = []
    for line in Path("/proc/mounts").read_text().splitlines():
        point = line.split()[1].replace("\\040", " ")
        if point == root or point.startswith(root + "/"):
            points.append(point)
    for point in sorted(points, key=len, reverse=True):
        subprocess.run(["umount", "-l", point], capture_output=True, check=False)
