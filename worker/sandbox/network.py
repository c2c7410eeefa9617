"""The egress filter of ``network: restricted``: only DNS (53) and HTTP/HTTPS (80, 443) leave.

Installed from the host into the container's network namespace (nsenter + iptables-restore) after
the container starts and before any command runs: the image needs no iptables and the program,
with no capabilities, cannot change it. Link-local addresses (cloud metadata) stay unreachable.
If the filter cannot be installed the sandbox refuses to start.
"""

from __future__ import annotations

import shutil
import subprocess
from typing import Any

from sandfleet.core.errors import SandboxError

ALLOWED_TCP_PORTS = (53, 80, 443)
ALLOWED_UDP_PORTS = (53,)


def ipv4_rules() -> str:
    lines = [
        "*filter",
        ":INPUT ACCEPT [0:0]",
        ":FORWARD DROP [0:0]",
        ":OUTPUT DROP [0:0]",
        "-A OUTPUT -o lo -j ACCEPT",
        "-A OUTPUT -d 169.254.0.0/16 -j DROP",
    ]
    lines += [f"-A OUTPUT -p udp --dport {p} -j ACCEPT" for p in ALLOWED_UDP_PORTS]
    lines += [f"-A OUTPUT -p tcp --dport {p} -j ACCEPT" for p in ALLOWED_TCP_PORTS]
    return "\n".join([*lines, "COMMIT", ""])


def ipv6_rules() -> str:
    return "\n".join(
        [
            "*filter",
            ":INPUT ACCEPT [0:0]",
            ":FORWARD DROP [0:0]",
            ":OUTPUT DROP [0:0]",
            "-A OUTPUT -o lo -j ACCEPT",
            "COMMIT",
            "",
        ]
    )


def install_restricted_filter(client: Any, container_id: str) -> None:
    """Load the egress filter into a running container's network namespace.

    Raises:
        SandboxError: the filter could not be installed (not root, no iptables, no such process).
    """
    for tool in ("nsenter", "iptables-restore"):
        if shutil.which(tool) is None:
            raise SandboxError(
                f"network 'restricted' needs {tool} on the worker host (apt-get install iptables util-linux)"
            )
    pid = client.api.inspect_container(container_id)["State"]["Pid"]
    if not pid:
        raise SandboxError("network 'restricted': the container has no process to attach the filter to")
    for command, rules in (("iptables-restore", ipv4_rules()), ("ip6tables-restore", ipv6_rules())):
        done = subprocess.run(
            ["nsenter", "-t", str(pid), "-n", command],
            input=rules,
            text=True,
            capture_output=True,
            timeout=20,
        )
        if done.returncode != 0 and command == "iptables-restore":
            raise SandboxError(
                f"network 'restricted': cannot install the egress filter: {done.stderr.strip()}"
            )
