"""The egress gateway of network "restricted": what the Docker backend asks of the egress modules.

``EgressGateway.prepare`` (before a restricted sandbox is created) makes sure the network, the host's
rules and the proxy are there; ``container_options`` puts the container on that network;
``attach`` (after the start, before the agent runs anything) installs and checks the sandbox's own
filter and registers its allow-list under its address; the returned EgressLease reads the sandbox's
refused connections and unregisters it on removal. Any failure raises EgressError: the sandbox is
removed unused (fail closed).
"""

from __future__ import annotations

import functools
import json
import os
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sandfleet.core.config import SandboxConfig
from sandfleet.core.settings import Settings, get_settings
from sandfleet.worker.egress.network import (
    EgressNetwork,
    ensure_docker_network,
    install_host_rules,
    install_sandbox_filter,
    verify_host_rules,
)
from sandfleet.worker.egress.squid import EgressError, ProxyConfig, ensure_proxy, running_pid

RECHECK_S = 5.0  # the network and host rules are checked again after this long
MAX_DENIALS = 200  # refused connections kept per run (the count is always exact)
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
    """One sandbox's registration with the proxy: its address and where its refusals are written."""

    sandbox_id: str
    address: str
    registration: Path
    denials_path: Path
    pid: int
    offset: int = 0
    refused: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def take_denials(self) -> list[dict[str, Any]]:
        """The connections refused since the last call (host, port, reason, ...), oldest first."""
        with self._lock:
            try:
                with open(self.denials_path, "rb") as f:
                    f.seek(self.offset)
                    data = f.read()
            except FileNotFoundError:
                return []
            complete = data[: data.rfind(b"\n") + 1]
            self.offset += len(complete)
        denials = []
        for line in complete.splitlines():
            try:
                entry = json.loads(line)
            except ValueError:
                continue
            denials.append({k: entry[k] for k in ("host", "port", "reason", "method", "sni") if k in entry})
        self.refused += len(denials)
        return denials

    def release(self) -> None:
        """Unregister (before the container goes, so its address cannot be reused meanwhile)."""
        try:
            entry = json.loads(self.registration.read_text())
            if entry.get("sandbox") == self.sandbox_id:
                self.registration.unlink()
        except (OSError, ValueError):
            pass
        try:
            self.denials_path.unlink()
        except OSError:
            pass


class EgressGateway:
    """The egress network, host rules and proxy of one worker host (shared by its sandboxes)."""

    def __init__(self, network: EgressNetwork, state_dir: Path, hosts_file: str) -> None:
        self.network = network
        self.proxy = ProxyConfig(network.gateway, network.proxy_port, state_dir, hosts_file)
        self._lock = threading.Lock()
        self._checked = 0.0

    @classmethod
    def from_settings(cls, settings: Settings) -> EgressGateway:
        network = network_of(settings)
        state = Path(settings.egress_state_dir).expanduser() / network.name
        return cls(network, state, settings.egress_hosts_file)

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
            install_host_rules(self.network)
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
        install_sandbox_filter(pid, self.network)
        verify_host_rules(self.network)
        if not running_pid(self.state_dir):
            raise EgressError("the egress proxy is not running")
        registration = self.state_dir / "clients" / address
        tmp = registration.with_name(f".{address}.{container_id[:12]}")
        tmp.write_text(json.dumps({"sandbox": container_id, "allow": list(config.allow_hosts)}))
        os.chmod(tmp, 0o644)
        os.replace(tmp, registration)
        return EgressLease(
            sandbox_id=container_id,
            address=address,
            registration=registration,
            denials_path=self.state_dir / "denials" / f"{container_id}.jsonl",
            pid=pid,
        )


@functools.lru_cache(maxsize=8)
def _gateway(network: EgressNetwork, state_dir: str, hosts_file: str) -> EgressGateway:
    return EgressGateway(network, Path(state_dir).expanduser() / network.name, hosts_file)


def egress_gateway(settings: Settings | None = None) -> EgressGateway:
    """The process's gateway for the settings' egress network (one per configuration)."""
    settings = settings or get_settings()
    return _gateway(network_of(settings), settings.egress_state_dir, settings.egress_hosts_file)


def take_denials(container: Any) -> list[dict[str, Any]]:
    """A sandbox's refused connections since the last call; [] for sandboxes without egress."""
    lease = getattr(getattr(container, "handle", None), "egress", None)
    return lease.take_denials() if lease is not None else []
