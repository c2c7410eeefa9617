"""The destination rule's pure parts: the refused ranges and the operator's exceptions, the settings'
refusals, the squid.conf and host chain written from them, and the proxy helper's two modes that
record refusals (run as Squid runs them: the script, standard input, a proxy folder)."""

from __future__ import annotations

import ipaddress
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from pydantic import ValidationError

from sandfleet.core.settings import Settings
from sandfleet.worker.egress.destinations import (
    CATEGORIES,
    DeniedRanges,
    filter_reason,
    parse_networks,
    reason,
)
from sandfleet.worker.egress.network import EgressNetwork, destination_rules
from sandfleet.worker.egress.squid import HELPER_FILES, ProxyConfig

# address -> the category that refuses it by default
DEFAULT_REFUSALS = {
    "127.0.0.1": "loopback",
    "127.255.0.9": "loopback",
    "::1": "loopback",
    "::ffff:127.0.0.1": "loopback",  # IPv4-mapped IPv6 counts as its IPv4
    "169.254.169.254": "link-local",
    "::ffff:169.254.169.254": "link-local",
    "fe80::1": "link-local",
    "10.1.2.3": "private",
    "172.17.0.1": "private",  # Docker's default bridge
    "192.168.1.1": "private",
    "fd00::2": "private",
    "100.64.0.1": "shared",
    "0.0.0.0": "special",
    "198.51.100.7": "special",
    "203.0.113.7": "special",
    "2001:db8::1": "special",
    "224.0.0.1": "special",
    "255.255.255.255": "special",
    "::": "special",
    "64:ff9b::a9fe:a9fe": "special",  # NAT64's form of 169.254.169.254
    "2002:7f00:1::": "special",  # 6to4 of 127.0.0.1
}
PUBLIC = ["1.0.0.1", "151.101.0.223", "2a04:4e42::223", "64:ff9b::102:304", "::ffff:1.0.0.1"]


@pytest.mark.parametrize(("address", "category"), sorted(DEFAULT_REFUSALS.items()))
def test_internal_addresses_are_refused_by_default(address: str, category: str) -> None:
    assert DeniedRanges.build().category_of(address) == category


@pytest.mark.parametrize("address", PUBLIC)
def test_public_addresses_are_not(address: str) -> None:
    assert DeniedRanges.build().category_of(address) is None  # strings only: nothing is contacted


def test_the_operators_ranges_are_cut_out_of_every_category() -> None:
    allowed = parse_networks(["10.231.5.0/30", "127.0.0.2", "fd00::/64"])
    denied = DeniedRanges.build(allowed)
    for address in ("10.231.5.1", "127.0.0.2", "fd00::9"):
        assert denied.category_of(address) is None, address
    for address in ("10.231.5.4", "127.0.0.1", "127.0.0.3", "fd00:0:0:1::1"):
        assert denied.category_of(address) is not None, address
    assert not any(n.overlaps(a) for n in denied.networks() for a in allowed if n.version == a.version)


def test_the_fleet_category_holds_only_what_no_other_category_covers() -> None:
    fleet = parse_networks(["172.18.0.0/16", "192.0.2.2/32", "8.8.4.0/24", "2a00:1450::5/128"])
    denied = DeniedRanges.build((), fleet)
    assert dict(denied.categories)["fleet"] == tuple(parse_networks(["8.8.4.0/24", "2a00:1450::5/128"]))
    assert denied.category_of("8.8.4.4") == "fleet" and denied.category_of("172.18.0.2") == "private"
    assert DeniedRanges.build((), parse_networks(["172.18.0.0/16"])) == DeniedRanges.build()  # same config


@pytest.mark.parametrize(
    ("entry", "says"),
    [
        ("10.0.0.1/8", "did you mean 10.0.0.0/8"),
        ("pypi.org", "not an IP address or CIDR"),
        ("10.0.0.0/33", "not an IP address or CIDR"),
    ],
)
def test_a_malformed_destination_is_refused_with_a_hint(entry: str, says: str) -> None:
    with pytest.raises(ValueError, match=says):
        parse_networks([entry])
    with pytest.raises(ValidationError, match="SANDFLEET_EGRESS_ALLOW_DESTINATIONS"):
        Settings(egress_allow_destinations=entry)


def test_the_settings_read_cidrs_and_dns_servers() -> None:
    settings = Settings(
        egress_allow_destinations="10.20.0.0/16, 192.168.1.5,fd00::/8", egress_dns_servers="10.0.0.2"
    )
    assert settings.egress_allow_destinations == ["10.20.0.0/16", "192.168.1.5/32", "fd00::/8"]
    assert settings.egress_dns_servers == ["10.0.0.2"]
    assert Settings().egress_allow_destinations == []  # deny by default
    with pytest.raises(ValidationError, match=r"SANDFLEET_EGRESS_DNS_SERVERS: 'dns\.example' is not an IP"):
        Settings(egress_dns_servers="dns.example")


def test_squid_conf_checks_the_destination_after_the_name(tmp_path: Path) -> None:
    denied = DeniedRanges.build(parse_networks(["10.231.5.2/32"]))
    conf = ProxyConfig(
        "10.213.1.1", 3128, tmp_path, "/etc/hosts", denied, ("10.0.0.53",), 0x53461234
    ).render()
    lines = conf.splitlines()
    assert "tcp_outgoing_mark 0x53461234 all" in lines and "dns_nameservers 10.0.0.53" in lines
    for acl in denied.squid_refusal_acls():
        assert f"deny_info ERR_SANDFLEET_DENIED {acl}" in lines
    order = [
        "http_access deny !CONNECT !sf_request_ok",
        "http_access deny !CONNECT sf_dst_loopback sf_dst_loopback_refused",
        "http_access allow all",
        "ssl_bump terminate step1 !sf_request_ok",
        "ssl_bump terminate step1 sf_dst_link_local sf_dst_link_local_refused",
        "ssl_bump peek step1",
    ]
    assert [lines.index(line) for line in order] == sorted(lines.index(line) for line in order)
    private = next(line for line in lines if line.startswith("acl sf_dst_private dst "))
    assert "10.231.5.2" not in private and "10.231.5.3/32" in private
    # Squid keeps IPv4 as IPv4-mapped IPv6: a ::ffff:0:0/96 entry would refuse every IPv4 address.
    assert "::ffff:" not in conf


def test_the_hosts_destination_chain_returns_the_listed_ranges_first() -> None:
    net = EgressNetwork("sfeg", "sfegress9", "10.213.9.0/24", 3128)
    denied = DeniedRanges.build(parse_networks(["10.231.5.2/32", "fd00::/64"]))
    v4, v6 = destination_rules(net, denied, 4), destination_rules(net, denied, 6)
    chain = net.destination_chain
    assert v4[0] == f"-A {chain} -d 10.231.5.2/32 -j RETURN"
    assert v4[1] == f"-A {chain} -m addrtype --dst-type LOCAL -j REJECT --reject-with icmp-admin-prohibited"
    assert f"-A {chain} -d 169.254.0.0/16 -j REJECT --reject-with icmp-admin-prohibited" in v4
    assert v6[0] == f"-A {chain} -d fd00::/64 -j RETURN"
    assert f"-A {chain} -d ::1/128 -j REJECT --reject-with icmp6-adm-prohibited" in v6
    assert (
        net.mark >> 16 == 0x5346 and net.mark != EgressNetwork("x", "sfegress8", "10.213.8.0/24", 3128).mark
    )


@pytest.fixture
def proxy_folder(tmp_path: Path) -> Path:
    """A proxy folder as prepare_state writes it, with one registered sandbox at 10.213.9.2."""
    for name, source in HELPER_FILES.items():
        (tmp_path / name).write_bytes(source.read_bytes())
    for sub in ("clients", "denials"):
        (tmp_path / sub).mkdir()
    (tmp_path / "clients" / "10.213.9.2").write_text(
        json.dumps({"sandbox": "sb1", "allow": ["api.dst.invalid"]})
    )
    (tmp_path / "destinations.json").write_text(
        DeniedRanges.build(parse_networks(["10.231.5.2/32"])).to_json()
    )
    return tmp_path


def helper(folder: Path, mode: str, lines: str) -> str:
    done = subprocess.run(
        [sys.executable, "-I", "-S", str(folder / "helper.py"), str(folder), mode],
        input=lines,
        capture_output=True,
        text=True,
        timeout=30,
        env={"PATH": os.environ.get("PATH", "")},
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def denials(folder: Path, sandbox: str = "sb1") -> list[dict[str, object]]:
    path = folder / "denials" / f"{sandbox}.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def test_the_helper_records_a_destination_refusal_and_matches(proxy_folder: Path) -> None:
    reply = helper(proxy_folder, "destination", "10.213.9.2 CONNECT api.dst.invalid 443 link-local\n")
    assert reply == f'OK message="sandfleet egress refused api.dst.invalid:443: {reason("link-local")}"\n'
    (entry,) = denials(proxy_folder)
    assert {k: entry[k] for k in ("host", "port", "method", "reason")} == {
        "host": "api.dst.invalid",
        "port": 443,
        "method": "CONNECT",
        "reason": "the name resolves to a link-local address (where cloud metadata services answer): "
        "internal addresses are refused (destination rule)",
    }
    helper(proxy_folder, "destination", "10.99.0.1 GET api.dst.invalid 80 loopback\n")  # no sandbox there
    assert denials(proxy_folder, "unknown")[0]["reason"] == reason("loopback")


def test_the_log_daemon_records_connections_the_hosts_filter_refused(proxy_folder: Path) -> None:
    log = "".join(
        f"L{line}\n"
        for line in (
            "10.213.9.2 CONNECT api.dst.invalid 443 169.254.222.7 - 503",  # spliced, the connect failed
            "10.213.9.2 GET api.dst.invalid 80 127.0.0.5 ERR_CONNECT_FAIL 503",
            "10.213.9.2 GET api.dst.invalid 80 10.231.5.2 ERR_CONNECT_FAIL 503",  # listed: not ours
            "10.213.9.2 GET api.dst.invalid 80 151.101.0.223 ERR_CONNECT_FAIL 503",  # public: not ours
            "10.213.9.2 GET api.dst.invalid 443 169.254.222.7 - 200",  # no failure
            "10.213.9.2 GET - - - ERR_SANDFLEET_DENIED 403",
            "garbage",
        )
    )
    assert helper(proxy_folder, "log", "R\n" + log + "F\n") == ""  # a log daemon answers nothing
    assert [(d["method"], d["port"], d["reason"]) for d in denials(proxy_folder)] == [
        ("CONNECT", 443, filter_reason("169.254.222.7", "link-local")),
        ("GET", 80, filter_reason("127.0.0.5", "loopback")),
    ]


def test_every_category_has_its_reason() -> None:
    for key in CATEGORIES:
        assert "(destination rule)" in reason(key)
    assert ipaddress.ip_network("64:ff9b::/96") not in DeniedRanges.build().networks()
