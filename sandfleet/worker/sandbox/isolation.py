"""What a fresh sandbox sees of the network, held against what its config promises, before any use.

Network "none" is asked of the engine the cheapest way proven equal (spec.network_kwargs), and the
host does not take the engine's word for it: each sandbox's agent reports, in its hello and before
any program has run, its network namespace, its interfaces and the interfaces its routes go through
(agent.network_view). A sandbox of network "none" must have a namespace that is not the worker's,
only the loopback interface, and routes through nothing else; one that shows more, or whose view is
missing, is destroyed unused (fail closed). Pure apart from reading the worker's own namespace.
"""

from __future__ import annotations

import functools
import os
from typing import Any

from sandfleet.core.config import SandboxConfig

LOOPBACK = "lo"


@functools.lru_cache(maxsize=1)
def worker_netns() -> str | None:
    """This process's network namespace (``net:[inode]``), or None where /proc does not say."""
    try:
        return os.readlink("/proc/self/ns/net")
    except OSError:
        return None


def network_refusal(config: SandboxConfig, view: Any, host_netns: str | None = None) -> str | None:
    """Why a sandbox that reported ``view`` must not be used under ``config``; None when it may.

    Only network "none" is checked: restricted and full have an interface on the bridge by design
    (restricted's filter is checked where it is installed, network.py).
    """
    if config.network != "none":
        return None
    if not isinstance(view, dict):
        return "the sandbox did not report its network; refusing to use it"
    host_netns = host_netns if host_netns is not None else worker_netns()
    netns, interfaces, routes = view.get("netns"), view.get("interfaces"), view.get("routes")
    if not isinstance(netns, str) or not netns.startswith("net:"):
        return f"the sandbox did not report its network namespace ({netns!r}); refusing to use it"
    if host_netns is not None and netns == host_netns:
        return f"the sandbox shares the worker's network namespace ({netns}); refusing to use it"
    if interfaces != [LOOPBACK]:
        return f"network 'none' but the sandbox sees interfaces {interfaces!r}; refusing to use it"
    if not isinstance(routes, list) or any(route != LOOPBACK for route in routes):
        return f"network 'none' but the sandbox has routes through {routes!r}; refusing to use it"
    return None


def describe_network(config: SandboxConfig, view: Any, attrs: dict[str, Any]) -> dict[str, Any]:
    """The network as ``sandfleet sandbox inspect`` reports it: asked for, what Docker made (its
    ``docker inspect`` ``attrs``), and what the sandbox sees from inside."""
    view = view if isinstance(view, dict) else {}
    netns = view.get("netns")
    return {
        "Requested": config.network,
        "NetworkMode": attrs["HostConfig"].get("NetworkMode"),
        "NetworkDisabled": bool(attrs["Config"].get("NetworkDisabled")),
        "Namespace": netns,
        "NamespaceOfItsOwn": netns is not None and netns != worker_netns(),
        "Interfaces": view.get("interfaces"),
        "RoutesThrough": view.get("routes"),
        "Verified": network_refusal(config, view) is None if config.network == "none" else None,
    }
