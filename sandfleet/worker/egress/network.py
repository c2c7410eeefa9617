"""The egress network: a Docker network whose only way out is the proxy, enforced in three places.

1. The Docker network is ``internal`` (no NAT, Docker drops what leaves its subnet) with
   inter-container traffic off (``enable_icc=false``: one sandbox cannot reach another).
2. The host's INPUT chain lets the bridge reach the proxy's port on the gateway address and rejects
   everything else (the host itself: Redis, the Docker API over TCP, SSH, any service); IPv6 from
   the bridge is dropped and the bridge has no IPv6 address.
3. Each sandbox's own network namespace gets an OUTPUT filter (sandbox_filter.py): TCP to the
   proxy only, everything else rejected at once, logged (nflog.py) and counted.

4. The proxy's own connections (marked by Squid, ``tcp_outgoing_mark``) pass the host's OUTPUT
   through a chain of this network that refuses the internal ranges of destinations.py and every
   address of the host, except what the operator listed: whatever Squid resolved, the kernel sees
   the address it really connects to.

Every rule is checked after it is written; one that is not there refuses the sandbox (EgressError).
"""

from __future__ import annotations

import ipaddress
import json
import shutil
import subprocess
import zlib
from dataclasses import dataclass
from typing import Any

from sandfleet.worker.egress.destinations import DeniedRanges, IPNetwork
from sandfleet.worker.egress.squid import EgressError

NETWORK_LABEL = "sandfleet.egress"


@dataclass(frozen=True)
class EgressNetwork:
    """One egress network: Docker's name, the host bridge's name, its subnet and the proxy's port."""

    name: str
    bridge: str
    subnet: str
    proxy_port: int

    @property
    def gateway(self) -> str:
        return str(next(ipaddress.ip_network(self.subnet).hosts()))

    @property
    def chain(self) -> str:
        return f"SFEG-{self.bridge}"[:28]

    @property
    def destination_chain(self) -> str:
        return f"SFEGD-{self.bridge}"[:28]

    @property
    def mark(self) -> int:
        """The netfilter mark of this network's proxy connections: 0x5346 ("SF") and 16 bits of
        the bridge's name, so that two proxies on one host keep their own destination filters."""
        return 0x53460000 | (zlib.crc32(self.bridge.encode()) & 0xFFFF)


def _run(args: list[str], stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, input=stdin, capture_output=True, text=True, timeout=20)


def require_tools() -> None:
    for tool in ("nsenter", "iptables", "iptables-restore", "ip6tables", "ip6tables-restore", "ip"):
        if shutil.which(tool) is None:
            raise EgressError(
                f"network 'restricted' needs {tool} on the worker host (run deploy/bootstrap.sh: "
                "apt-get install iptables util-linux iproute2)"
            )


def ensure_docker_network(client: Any, net: EgressNetwork) -> None:
    """The internal, no-ICC Docker network of ``net`` (created once; an existing one is checked).

    The engine's own errors pass through: the caller (sandbox/engine.py) translates them.
    """
    if not any(found.get("Name") == net.name for found in client.api.networks(names=[net.name])):
        ipam = {"Driver": "default", "Config": [{"Subnet": net.subnet, "Gateway": net.gateway}]}
        client.api.create_network(
            net.name,
            driver="bridge",
            internal=True,
            enable_ipv6=False,
            ipam=ipam,
            labels={NETWORK_LABEL: "1"},
            options={
                "com.docker.network.bridge.name": net.bridge,
                "com.docker.network.bridge.enable_icc": "false",
                "com.docker.network.bridge.enable_ip_masquerade": "false",
            },
            check_duplicate=True,
        )
    attrs = client.api.inspect_network(net.name)
    options = attrs.get("Options") or {}
    configs = (attrs.get("IPAM") or {}).get("Config") or [{}]
    problems = []
    if not attrs.get("Internal"):
        problems.append("it is not internal")
    if options.get("com.docker.network.bridge.enable_icc") != "false":
        problems.append("containers on it can reach each other (enable_icc is not false)")
    if options.get("com.docker.network.bridge.name") != net.bridge:
        problems.append(f"its bridge is not {net.bridge}")
    if configs[0].get("Subnet") != net.subnet:
        problems.append(f"its subnet is {configs[0].get('Subnet')}, not {net.subnet}")
    if attrs.get("EnableIPv6"):
        problems.append("it has IPv6")
    if problems:
        raise EgressError(
            f"the Docker network {net.name!r} cannot be the egress network: {'; '.join(problems)}. "
            "Remove it (docker network rm) or set SANDFLEET_EGRESS_NETWORK to another name"
        )


def host_rules(net: EgressNetwork) -> list[list[str]]:
    """The host's rules of this network, as ``iptables`` arguments after ``-A``/``-C``."""
    return [
        [net.chain, "-p", "tcp", "-d", net.gateway, "--dport", str(net.proxy_port), "-j", "ACCEPT"],
        [net.chain, "-p", "tcp", "-j", "REJECT", "--reject-with", "tcp-reset"],
        [net.chain, "-j", "REJECT", "--reject-with", "icmp-admin-prohibited"],
    ]


def install_host_rules(net: EgressNetwork) -> None:
    """Write the host's rules for ``net`` where missing, then check every one.

    Raises:
        EgressError: a rule cannot be written or is not there afterwards.
    """
    require_tools()
    if _run(["iptables", "-n", "-L", net.chain]).returncode != 0:
        _run(["iptables", "-N", net.chain])
    for rule in host_rules(net):
        if _run(["iptables", "-C", *rule]).returncode != 0:
            _run(["iptables", "-A", *rule])
    jump = ["INPUT", "-i", net.bridge, "-j", net.chain]
    if _run(["iptables", "-C", *jump]).returncode != 0:
        _run(["iptables", "-I", *jump[:1], "1", *jump[1:]])
    for chain in ("INPUT", "FORWARD"):
        drop6 = [chain, "-i", net.bridge, "-j", "DROP"]
        if _run(["ip6tables", "-C", *drop6]).returncode != 0:
            _run(["ip6tables", "-I", chain, "1", *drop6[1:]])
    try:
        with open(f"/proc/sys/net/ipv6/conf/{net.bridge}/disable_ipv6", "w") as f:
            f.write("1")
    except OSError:
        pass  # no IPv6 on this host at all, or the bridge has no interface yet (no container)
    verify_host_rules(net)


def verify_host_rules(net: EgressNetwork) -> None:
    missing = [" ".join(rule) for rule in host_rules(net) if _run(["iptables", "-C", *rule]).returncode]
    if _run(["iptables", "-C", "INPUT", "-i", net.bridge, "-j", net.chain]).returncode:
        missing.append(f"INPUT -i {net.bridge} -j {net.chain}")
    for chain in ("INPUT", "FORWARD"):
        if _run(["ip6tables", "-C", chain, "-i", net.bridge, "-j", "DROP"]).returncode:
            missing.append(f"ip6tables {chain} -i {net.bridge} -j DROP")
    if missing:
        raise EgressError(f"the host's egress rules are not in place: {'; '.join(missing)}")


def remove_host_rules(net: EgressNetwork) -> None:
    """Undo install_host_rules and install_destination_filter (tests, an operator retiring a network)."""
    _run(["iptables", "-D", "INPUT", "-i", net.bridge, "-j", net.chain])
    _run(["iptables", "-F", net.chain])
    _run(["iptables", "-X", net.chain])
    for chain in ("INPUT", "FORWARD"):
        _run(["ip6tables", "-D", chain, "-i", net.bridge, "-j", "DROP"])
    for tool in ("iptables", "ip6tables"):
        _run([tool, "-D", *_destination_jump(net)])
        _run([tool, "-F", net.destination_chain])
        _run([tool, "-X", net.destination_chain])


def _destination_jump(net: EgressNetwork) -> list[str]:
    return ["OUTPUT", "-m", "mark", "--mark", f"{net.mark:#x}", "-j", net.destination_chain]


def destination_rules(net: EgressNetwork, denied: DeniedRanges, version: int) -> list[str]:
    """The destination chain of ``net`` for IPv4 or IPv6, in ``iptables -S`` form: the operator's
    ranges return (pass), the host's own addresses and the refused ranges are rejected at once
    (EHOSTUNREACH for Squid, which logs it; never a hang)."""
    chain = net.destination_chain
    reject = f"-j REJECT --reject-with {'icmp-admin-prohibited' if version == 4 else 'icmp6-adm-prohibited'}"
    rules = [f"-A {chain} -d {n} -j RETURN" for n in denied.allowed if n.version == version]
    rules.append(f"-A {chain} -m addrtype --dst-type LOCAL {reject}")
    rules += [f"-A {chain} -d {n} {reject}" for n in denied.networks(version)]
    return rules


def install_destination_filter(net: EgressNetwork, denied: DeniedRanges) -> None:
    """Write the destination chain of ``net`` (both families) where it differs, then check it.

    The chain is replaced in one ``iptables-restore --noflush`` (declaring a chain flushes it in
    the same transaction): no moment without rules for connections already marked.

    Raises:
        EgressError: it cannot be written or is not there afterwards.
    """
    require_tools()
    for version, tool in ((4, "iptables"), (6, "ip6tables")):
        expected = destination_rules(net, denied, version)
        if _chain_rules(tool, net.destination_chain) != expected:
            restore = "\n".join(["*filter", f":{net.destination_chain} - [0:0]", *expected, "COMMIT", ""])
            done = _run([f"{tool}-restore", "--noflush"], stdin=restore)
            if done.returncode != 0:
                raise EgressError(
                    f"cannot write the proxy's destination filter ({tool}): {done.stderr.strip()}"
                )
        jump = _destination_jump(net)
        if _run([tool, "-C", *jump]).returncode != 0:
            _run([tool, "-I", jump[0], "1", *jump[1:]])
    verify_destination_filter(net, denied)


def verify_destination_filter(net: EgressNetwork, denied: DeniedRanges) -> None:
    """Raises EgressError unless both families' destination chains and their jumps are in place."""
    for version, tool in ((4, "iptables"), (6, "ip6tables")):
        if _chain_rules(tool, net.destination_chain) != destination_rules(net, denied, version):
            raise EgressError(
                f"the proxy's destination filter ({tool} {net.destination_chain}) is not in place"
            )
        if _run([tool, "-C", *_destination_jump(net)]).returncode != 0:
            raise EgressError(
                f"the host's OUTPUT does not send the proxy's connections to {net.destination_chain}"
            )


def _chain_rules(tool: str, chain: str) -> list[str]:
    shown = _run([tool, "-S", chain])
    return (
        [line for line in shown.stdout.splitlines() if line.startswith("-A ")]
        if shown.returncode == 0
        else []
    )


def fleet_networks(client: Any) -> list[IPNetwork]:
    """The worker host's own addresses (each alone) and its Docker networks' subnets: the "fleet"
    category of destinations.py. Read at each check of the gateway; an address that appears in
    between is refused by the kernel (``addrtype LOCAL``) all the same."""
    found: list[IPNetwork] = []
    for attrs in client.api.networks():
        for config in (attrs.get("IPAM") or {}).get("Config") or []:
            try:
                found.append(ipaddress.ip_network(config.get("Subnet", ""), strict=False))
            except ValueError:
                continue
    require_tools()
    shown = _run(["ip", "-j", "addr", "show"])
    try:
        interfaces = json.loads(shown.stdout) if shown.returncode == 0 else []
    except ValueError:
        interfaces = []
    for interface in interfaces:
        for address in interface.get("addr_info", []):
            try:
                found.append(ipaddress.ip_network(address["local"]))
            except (KeyError, ValueError):
                continue
    return found
