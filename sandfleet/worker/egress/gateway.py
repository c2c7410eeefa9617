"""The egress gateway of network "restricted": what the Docker backend asks of the egress modules.

``EgressGateway.prepare`` (before a restricted sandbox is created) makes sure the network, the host's
rules (the proxy's destination filter among them, for the ranges of destinations.py as the host and
its Docker networks are at that moment) and the proxy are there; ``container_options`` puts the container on that network;
``attach`` (after the start, before the agent runs anything) holds the sandbox's network namespace
(netns.py), installs and checks its own filter and routes its IPv6 into it (sandbox_filter.py), opens
the filter's log (nflog.py) and registers its allow-list under its address; the returned EgressLease
reads the sandbox's refused connections (the proxy's and the packet filter's, itemised, and how many
there were in all) and unregisters it on removal. Any failure raises EgressError: the sandbox is
removed unused (fail closed).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import logging
import os
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sandfleet.core.config import SandboxConfig
from sandfleet.core.settings import Settings, get_settings
from sandfleet.worker.egress.destinations import DeniedRanges, IPNetwork, parse_networks
from sandfleet.worker.egress.netns import NetnsError, SandboxNetns
from sandfleet.worker.egress.network import (
    EgressNetwork,
    ensure_docker_network,
    fleet_networks,
    install_destination_filter,
    install_host_rules,
    verify_destination_filter,
    verify_host_rules,
)
from sandfleet.worker.egress.nflog import FilterLog, FilterLogError
from sandfleet.worker.egress.refusals import Refusals as Refusals
from sandfleet.worker.egress.refusals import take_refusals as take_refusals
from sandfleet.worker.egress.sandbox_filter import (
    install_sandbox_filter,
    refused_packets,
    route_ipv6_into_filter,
)
from sandfleet.worker.egress.squid import EgressError, ProxyConfig, ensure_proxy, running_pid

log = logging.getLogger(__name__)

RECHECK_S = 5.0  # the network and host rules are checked again after this long
CA_INSIDE = "/opt/sandfleet/egress/ca.pem"  # where SANDFLEET_EGRESS_CA_FILE is mounted read-only


def proxy_environment(network: EgressNetwork) -> dict[str, str]:
    """The proxy variables every HTTP client honours (urllib, requests, pip, curl)."""
    url = f"http://{network.gateway}:{network.proxy_port}"
    return {
        "HTTP_PROXY": url,
        "HTTPS_PROXY": url,
        "http_proxy": url,
        "https_proxy": url,
        "NO_PROXY": "",
        "no_proxy": "",
    }


def sandbox_environment(settings: Settings, network: EgressNetwork) -> dict[str, str]:
    """A restricted sandbox's variables: the proxy's, and the operator's package index and CA bundle
    (SANDFLEET_EGRESS_PIP_INDEX_URL, SANDFLEET_EGRESS_CA_FILE) for pip, requests and Python's ssl."""
    env = proxy_environment(network)
    if settings.egress_pip_index_url:
        env["PIP_INDEX_URL"] = settings.egress_pip_index_url
    if settings.egress_ca_file:
        env |= {"PIP_CERT": CA_INSIDE, "REQUESTS_CA_BUNDLE": CA_INSIDE, "SSL_CERT_FILE": CA_INSIDE}
    return env


def sandbox_mounts(settings: Settings) -> dict[str, str]:
    """Host file -> path inside, mounted read-only into restricted sandboxes (the operator's CA bundle).

    Raises:
        EgressError: the configured bundle is not a readable PEM file (the sandbox does not start).
    """
    if not settings.egress_ca_file:
        return {}
    path = Path(settings.egress_ca_file).expanduser().resolve()
    try:
        text = path.read_text(errors="replace")
    except OSError as e:
        raise EgressError(f"SANDFLEET_EGRESS_CA_FILE {str(path)!r} cannot be read: {e.strerror}") from None
    if "-----BEGIN CERTIFICATE-----" not in text:
        raise EgressError(f"SANDFLEET_EGRESS_CA_FILE {str(path)!r} holds no PEM certificate")
    return {str(path): CA_INSIDE}


def network_of(settings: Settings) -> EgressNetwork:
    return EgressNetwork(
        name=settings.egress_network,
        bridge=settings.egress_bridge,
        subnet=settings.egress_subnet,
        proxy_port=settings.egress_proxy_port,
    )


@dataclass
class EgressLease:
    """One sandbox's registration with the proxy: its address, its namespace (held until release) and
    where its refusals are written."""

    sandbox_id: str
    address: str
    registration: Path
    denials_path: Path
    pid: int
    netns: SandboxNetns
    filter_log: FilterLog | None = None  # the packet filter's refusals (None: not opened)
    offset: int = 0
    refused: int = 0  # every refusal taken so far
    filter_reported: int = 0  # the filter's refusals reported so far (listed or not)
    released: bool = False
    left: Refusals = field(default_factory=Refusals)  # taken by release, not yet by a take
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def take(self) -> Refusals:
        """The connections refused since the last call: the proxy's, then the packet filter's, one
        entry per destination and reason in order of first refusal, and the count of all of them.
        After ``release``: what it took last, once (a sandbox destroyed mid-run loses nothing)."""
        with self._lock:
            if self.released:
                left, self.left = self.left, Refusals()
                return left
            return self._take()

    def _take(self) -> Refusals:  # holds _lock
        """The log is drained before the counters are read, so they never count fewer than it
        listed; a packet counted before its log entry was read is reported unlisted now and never
        again (``filter_reported``)."""
        proxy = self._proxy_denials()
        logged = self.filter_log.take() if self.filter_log is not None else []
        counted = refused_packets(self.netns)
        listed = sum(d["count"] for d in logged)
        if counted is None:
            log.warning("sandbox %s: its filter's counters cannot be read", self.sandbox_id[:12])
            counted = self.filter_reported + listed
        filtered = max(counted - self.filter_reported, listed)
        self.filter_reported += filtered
        taken = Refusals(proxy + logged, sum(d["count"] for d in proxy) + filtered)
        self.refused += taken.total
        return taken

    def _proxy_denials(self) -> list[dict[str, Any]]:  # holds _lock
        try:
            with open(self.denials_path, "rb") as f:
                f.seek(self.offset)
                data = f.read()
        except FileNotFoundError:
            return []
        complete = data[: data.rfind(b"\n") + 1]
        self.offset += len(complete)
        merged: dict[str, dict[str, Any]] = {}  # a model that loops: one entry, counted
        for line in complete.splitlines():
            try:
                entry = json.loads(line)
            except ValueError:
                continue
            denial = {k: entry[k] for k in ("host", "port", "reason", "method", "sni") if k in entry}
            key = json.dumps(denial, sort_keys=True)
            if key in merged:
                merged[key]["count"] += 1
            else:
                merged[key] = {**denial, "count": 1}
        return list(merged.values())

    def unregister(self) -> None:
        """Take the sandbox's allow-list off the proxy: before its container goes, so that its
        address, given to another sandbox meanwhile, is never let through on this list."""
        try:
            entry = json.loads(self.registration.read_text())
            if entry.get("sandbox") == self.sandbox_id:
                self.registration.unlink()
        except (OSError, ValueError):
            pass

    def release(self) -> None:
        """Unregister, and let the sandbox's namespace go once its container has gone (its counters
        final), keeping what it refused since the last take for the next one: a run or a session
        whose container was destroyed loses nothing. Idempotent; never raises."""
        self.unregister()
        with self._lock:
            if self.released:
                return
            try:
                self.left = self._take()
            except Exception:
                log.exception("sandbox %s: its last refusals could not be read", self.sandbox_id[:12])
            self.released = True
            if self.filter_log is not None:
                self.filter_log.close()
            self.netns.close()
        try:
            self.denials_path.unlink()
        except OSError:
            pass


class EgressGateway:
    """The egress network, host rules and proxy of one worker host (shared by its sandboxes)."""

    def __init__(
        self,
        network: EgressNetwork,
        state_dir: Path,
        hosts_file: str,
        allowed: tuple[IPNetwork, ...] = (),
        dns_servers: tuple[str, ...] = (),
    ) -> None:
        self.network = network
        self.allowed = allowed  # the operator's SANDFLEET_EGRESS_ALLOW_DESTINATIONS
        self.proxy = ProxyConfig(
            network.gateway,
            network.proxy_port,
            state_dir,
            hosts_file,
            DeniedRanges.build(allowed),
            dns_servers,
            network.mark,
        )
        self._lock = threading.Lock()
        self._checked = 0.0

    @classmethod
    def from_settings(cls, settings: Settings) -> EgressGateway:
        network = network_of(settings)
        state = Path(settings.egress_state_dir).expanduser() / network.name
        return cls(
            network,
            state,
            settings.egress_hosts_file,
            tuple(parse_networks(settings.egress_allow_destinations)),
            tuple(settings.egress_dns_servers),
        )

    @property
    def state_dir(self) -> Path:
        return self.proxy.state_dir

    def prepare(self, client: Any) -> None:
        """Network, host rules and a running proxy, checked at most every RECHECK_S (the proxy's pid
        every time).

        Raises:
            EgressError: one of them cannot be set up or verified.
        """
        with self._lock:
            if time.monotonic() - self._checked < RECHECK_S and running_pid(self.state_dir):
                return
            if os.geteuid() != 0:
                raise EgressError("network 'restricted' needs a worker running as root (iptables, nsenter)")
            ensure_docker_network(client, self.network)
            denied = DeniedRanges.build(self.allowed, fleet_networks(client))
            self.proxy = dataclasses.replace(self.proxy, denied=denied)
            install_host_rules(self.network)
            install_destination_filter(self.network, denied)
            ensure_proxy(self.proxy)
            self._checked = time.monotonic()

    def container_options(self) -> dict[str, Any]:
        return {"network_mode": self.network.name}

    def attach(self, client: Any, container_id: str, config: SandboxConfig) -> EgressLease:
        """Filter and register a started sandbox; returns its lease.

        Raises:
            EgressError: the container has no process or address on the network, or its filter or
                the host's rules do not verify.
        """
        attrs = client.api.inspect_container(container_id)
        pid = int(attrs["State"].get("Pid") or 0)
        if not pid:
            raise EgressError("the sandbox has no process to attach the egress filter to")
        networks = (attrs.get("NetworkSettings") or {}).get("Networks") or {}
        address = (networks.get(self.network.name) or {}).get("IPAddress")
        if not address or set(networks) != {self.network.name}:
            raise EgressError(
                f"the sandbox is not on the egress network {self.network.name!r} alone (networks: {sorted(networks)})"
            )
        try:
            netns = SandboxNetns.open(pid)
        except NetnsError as e:
            raise EgressError(str(e)) from None
        registration = self.state_dir / "clients" / address
        filter_log = None
        try:
            filter_log = self._filter(netns)
            tmp = registration.with_name(f".{address}.{container_id[:12]}")
            tmp.write_text(json.dumps({"sandbox": container_id, "allow": list(config.allow_hosts)}))
            os.chmod(tmp, 0o644)
            os.replace(tmp, registration)
        except BaseException:
            if filter_log is not None:
                filter_log.close()
            netns.close()
            raise
        return EgressLease(
            sandbox_id=container_id,
            address=address,
            registration=registration,
            denials_path=self.state_dir / "denials" / f"{container_id}.jsonl",
            pid=pid,
            netns=netns,
            filter_log=filter_log,
        )

    def _filter(self, netns: SandboxNetns) -> FilterLog:
        """The sandbox's filter and IPv6 route in place, the host's rules and the proxy checked; the
        filter's log opened."""
        install_sandbox_filter(netns, self.network)
        route_ipv6_into_filter(netns)
        verify_host_rules(self.network)
        verify_destination_filter(self.network, self.proxy.denied)
        if not running_pid(self.state_dir):
            raise EgressError("the egress proxy is not running")
        try:
            return FilterLog.open(netns)
        except FilterLogError as e:
            raise EgressError(str(e)) from None


@functools.lru_cache(maxsize=8)
def _gateway(
    network: EgressNetwork, state_dir: str, hosts_file: str, allowed: tuple[str, ...], dns: tuple[str, ...]
) -> EgressGateway:
    state = Path(state_dir).expanduser() / network.name
    return EgressGateway(network, state, hosts_file, tuple(parse_networks(allowed)), dns)


def egress_gateway(settings: Settings | None = None) -> EgressGateway:
    """The process's gateway for the settings' egress network (one per configuration)."""
    settings = settings or get_settings()
    return _gateway(
        network_of(settings),
        settings.egress_state_dir,
        settings.egress_hosts_file,
        tuple(settings.egress_allow_destinations),
        tuple(settings.egress_dns_servers),
    )
