"""The sandbox's own packet filter: in its network namespace, the one way out is TCP to the proxy.

Loaded from the host (iptables-restore through netns.py, as the program has no capabilities to
change it) after the container started and before the agent runs anything, then checked rule by
rule: TCP to the proxy only, Docker's embedded DNS (127.0.0.11) rejected, every other packet
rejected at once (a clean ECONNREFUSED or EPERM, never a hang). Before the REJECTs a rate-limited
NFLOG rule logs the packet (for 127.0.0.11 in the raw table, before Docker's DNAT of port 53), so
that nflog.py can itemise refusals in the run's record; the REJECT rules' own counters count every
refused packet whatever the log's rate (``refused_packets``): what the log could not itemise is
still reported, as a number. The counters live in the sandbox's namespace: nothing to remove.

IPv6: Docker disables it in a container's namespace (no address at all, not even ::1), so an IPv6
connect used to fail in the kernel before any packet existed (EADDRNOTAVAIL) and nothing saw it.
Once the ip6tables filter is in place, ``route_ipv6_into_filter`` enables IPv6 on ``lo`` only (eth0
keeps it off: no link-local address, nothing on the bridge) and routes every IPv6 destination to
lo, where the filter passes ::1 and logs and rejects the rest: an IPv6 attempt is refused, listed
and counted like an IPv4 one.

Under gVisor the sandbox runs with ``--network=host`` (runtime ``runsc-egress``): its sockets are the
host kernel's in that namespace, so the same filter, log and counters hold.
"""

from __future__ import annotations

import subprocess

from sandfleet.worker.egress.netns import NetnsError, SandboxNetns
from sandfleet.worker.egress.network import EgressNetwork, require_tools
from sandfleet.worker.egress.nflog import nflog_rule
from sandfleet.worker.egress.squid import EgressError

DOCKER_DNS = "127.0.0.11"
IPV6_PROBE = "2001:db8::1"  # a global address: `ip route get` says where a packet to it would go
LO_IPV6 = "/proc/sys/net/ipv6/conf/lo/disable_ipv6"  # of the namespace of the thread that opens it


def sandbox_rules_v4(net: EgressNetwork) -> str:
    return "\n".join(
        [
            "*filter",
            ":INPUT ACCEPT [0:0]",
            ":FORWARD DROP [0:0]",
            ":OUTPUT DROP [0:0]",
            f"-A OUTPUT -d {DOCKER_DNS}/32 -p tcp -j REJECT --reject-with tcp-reset",
            f"-A OUTPUT -d {DOCKER_DNS}/32 -j REJECT --reject-with icmp-port-unreachable",
            "-A OUTPUT -o lo -j ACCEPT",
            f"-A OUTPUT -d {net.gateway}/32 -p tcp -m tcp --dport {net.proxy_port} -j ACCEPT",
            nflog_rule("sf:direct"),
            "-A OUTPUT -p tcp -j REJECT --reject-with tcp-reset",
            "-A OUTPUT -j REJECT --reject-with icmp-port-unreachable",
            "COMMIT",
            "",
        ]
    )


def sandbox_log_rules_v4() -> str:
    """The raw table's rule that logs DNS to Docker's resolver: raw comes before the nat table's
    DNAT of 127.0.0.11:53 to the resolver's own port, so the log shows port 53. Every packet it
    logs is rejected by the filter's 127.0.0.11 rules."""
    return "\n".join(
        [
            "*raw",
            ":PREROUTING ACCEPT [0:0]",
            ":OUTPUT ACCEPT [0:0]",
            nflog_rule("sf:dns", f"-d {DOCKER_DNS}/32"),
            "COMMIT",
            "",
        ]
    )


def sandbox_rules_v6() -> str:
    """Only ::1 passes on lo: every other destination is routed to lo too (route_ipv6_into_filter),
    and is logged and rejected here."""
    return "\n".join(
        [
            "*filter",
            ":INPUT DROP [0:0]",
            ":FORWARD DROP [0:0]",
            ":OUTPUT DROP [0:0]",
            "-A INPUT -i lo -j ACCEPT",
            "-A OUTPUT -d ::1/128 -o lo -j ACCEPT",
            nflog_rule("sf:v6"),
            "-A OUTPUT -p tcp -j REJECT --reject-with tcp-reset",
            "-A OUTPUT -j REJECT --reject-with icmp6-port-unreachable",
            "COMMIT",
            "",
        ]
    )


def _rule_lines(rules: str) -> list[str]:
    return [line for line in rules.splitlines() if line.startswith("-A ")]


def install_sandbox_filter(netns: SandboxNetns, net: EgressNetwork) -> None:
    """Load and check the sandbox's own filter in its network namespace.

    Raises:
        EgressError: it cannot be loaded, or ``iptables -S`` there does not show every rule.
    """
    require_tools()
    for restore, save, rules in (
        ("iptables-restore", ["iptables"], sandbox_rules_v4(net)),
        ("iptables-restore", ["iptables", "-t", "raw"], sandbox_log_rules_v4()),
        ("ip6tables-restore", ["ip6tables"], sandbox_rules_v6()),
    ):
        done = netns.run([restore], stdin=rules)
        if done.returncode != 0:
            raise EgressError(
                f"cannot install the sandbox's egress filter ({restore}): {done.stderr.strip()}"
            )
        shown = netns.run([*save, "-S"])
        present = set(shown.stdout.splitlines())
        missing = [line for line in _rule_lines(rules) if line not in present]
        policy_ok = "-P OUTPUT DROP" in present or rules.startswith("*raw")
        if shown.returncode != 0 or missing or not policy_ok:
            raise EgressError(
                f"the sandbox's egress filter did not verify ({' '.join(save)}): missing {missing}"
            )


def _enable_loopback_ipv6() -> None:
    with open(LO_IPV6, "w") as f:
        f.write("0")


def route_ipv6_into_filter(netns: SandboxNetns) -> None:
    """IPv6 on the sandbox's ``lo`` only, and every IPv6 destination routed there, into the filter
    (after install_sandbox_filter: until then the packets would meet no rule but OUTPUT's DROP).

    Raises:
        EgressError: it cannot be set, or ``ip -6 route get`` does not show lo with ::1 after.
    """
    try:
        netns.call(_enable_loopback_ipv6, name="sandfleet-ipv6-lo")
    except NetnsError as e:
        raise EgressError(f"cannot enable IPv6 on the sandbox's loopback: {e}") from None
    added = netns.run(["ip", "-6", "route", "replace", "default", "dev", "lo"])
    shown = netns.run(["ip", "-6", "route", "get", IPV6_PROBE])
    words = shown.stdout.split()
    routed = "dev" in words and words[words.index("dev") + 1 :][:1] == ["lo"] and "::1" in words
    if added.returncode or shown.returncode or not routed:
        problem = (added.stderr or shown.stderr or shown.stdout).strip()
        raise EgressError(f"the sandbox's IPv6 does not lead into its filter: {problem}")


def _output_counters(netns: SandboxNetns, tool: str) -> dict[str, int] | None:
    """Packets each OUTPUT rule matched (``TOOL -A ...`` text -> count); None when unreadable."""
    try:
        shown = netns.run([tool, "-S", "OUTPUT", "-v"])
    except (NetnsError, OSError, subprocess.SubprocessError):
        return None
    if shown.returncode != 0:
        return None
    counters: dict[str, int] = {}
    for line in shown.stdout.splitlines():
        parts = line.split()
        if line.startswith("-A OUTPUT") and "-c" in parts:
            at = parts.index("-c")
            packets = int(parts[at + 1])
            del parts[at : at + 3]
            counters[f"{tool} {' '.join(parts)}"] = packets
    return counters


def rule_counters(netns: SandboxNetns) -> dict[str, int]:
    """Packets each OUTPUT rule of a sandbox's filter matched, both families (``iptables -S`` text
    -> count; a family that cannot be read is left out)."""
    counters: dict[str, int] = {}
    for tool in ("iptables", "ip6tables"):
        counters |= _output_counters(netns, tool) or {}
    return counters


def refused_packets(netns: SandboxNetns) -> int | None:
    """Packets the filter's REJECT rules refused since it was loaded, both families: every refusal
    of the packet filter, logged or not. None when either family cannot be read."""
    total = 0
    for tool in ("iptables", "ip6tables"):
        counters = _output_counters(netns, tool)
        if counters is None:
            return None
        total += sum(packets for rule, packets in counters.items() if " -j REJECT " in f"{rule} ")
    return total
