"""The names of the destination tests (test_hostile_destinations.py): allowed names that the proxy's
hosts file points at internal addresses, written by the egress fixtures before the proxy starts."""

from __future__ import annotations

import subprocess
from typing import Any

DESTINATION_DOMAIN = "dst.invalid"


def destination_names(owned: Any, egress_gateway: str) -> dict[str, str]:
    """Allowed names (under DESTINATION_DOMAIN) that the proxy's hosts file points at internal
    addresses: this machine's loopback, the run's link-local and private addresses, Docker's bridge
    gateway, the egress network's own gateway (the proxy's address), the host's main address, and
    IPv4-mapped IPv6 forms; ``listed`` points at the one internal address the settings allow."""
    from sandfleet.worker.sandbox.docker.backend import docker_client

    bridge = docker_client().networks.get("bridge").attrs["IPAM"]["Config"][0].get("Gateway", "172.17.0.1")
    shown = subprocess.run(
        ["ip", "-4", "-o", "addr", "show", "scope", "global"], capture_output=True, text=True
    )
    host = next(
        (
            line.split()[3].split("/")[0]
            for line in shown.stdout.splitlines()
            if not line.split()[1].startswith(("docker", "br-", "sfeg", "egress"))
        ),
        "127.0.0.1",
    )
    return {
        f"loopback.{DESTINATION_DOMAIN}": "127.0.0.1",
        f"metadata.{DESTINATION_DOMAIN}": owned.link_local,
        f"private.{DESTINATION_DOMAIN}": owned.private,
        f"docker-gateway.{DESTINATION_DOMAIN}": str(bridge),
        f"egress-gateway.{DESTINATION_DOMAIN}": egress_gateway,
        f"host.{DESTINATION_DOMAIN}": host,
        f"mapped-loopback.{DESTINATION_DOMAIN}": "::ffff:127.0.0.1",
        f"mapped-metadata.{DESTINATION_DOMAIN}": f"::ffff:{owned.link_local}",
        f"listed.{DESTINATION_DOMAIN}": owned.private_b,
    }
