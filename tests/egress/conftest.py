"""Fixtures of the egress tests: a test HTTPS service in its own network namespace, and settings that
give this test run an egress network, bridge, subnet and proxy of its own (removed afterwards), with
the service's mirror as restricted sandboxes' package index and its CA as their trusted bundle.

The proxy asks only the test's own DNS server (dns_server.py, on the run's ``resolver`` address), and
may connect to two internal destinations only, which the settings list as an operator would: the
test service and the run's ``private_b`` address (SANDFLEET_EGRESS_ALLOW_DESTINATIONS). Names of the
destination tests are under ``dst.invalid`` on port ``dst_port``."""

from __future__ import annotations

import os
import shutil
import socket
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from .destination_names import DESTINATION_DOMAIN, destination_names
from .dns_server import TestDNSServer
from .service import TestService


def free_port_everywhere(addresses: list[str]) -> int:
    """A TCP port free on each of ``addresses`` (and the wildcard), from a range tests rarely use."""
    for port in range(20000 + os.getpid() % 9000, 30000):
        try:
            for address in ["0.0.0.0", *addresses]:
                with socket.socket(socket.AF_INET6 if ":" in address else socket.AF_INET) as probe:
                    probe.bind((address, port))
        except OSError:
            continue
        return port
    raise RuntimeError("no free port for the destination tests")


@pytest.fixture(scope="package")  # it sets os.environ: undone before the rest of the suite
def egress_env(
    tmp_path_factory: pytest.TempPathFactory, docker_engine: Any, owned_targets: Any
) -> Iterator[dict[str, Any]]:
    """The service, the DNS server, and SANDFLEET_EGRESS_* set for this process (the worker's settings)."""
    from sandbox.helpers import skip_or_fail

    from sandfleet.core.settings import get_settings
    from sandfleet.worker.egress import gateway as gateway_module

    if os.geteuid() != 0:
        skip_or_fail("the egress tests need root (network namespaces, iptables)")
    for tool in ("squid", "ip", "iptables", "nsenter", "openssl"):
        if shutil.which(tool) is None and not os.path.exists(f"/usr/sbin/{tool}"):
            skip_or_fail(f"{tool} is missing; run deploy/bootstrap.sh")
    if "runsc-egress" not in docker_engine.runtimes:
        skip_or_fail("runtime runsc-egress is not registered; run deploy/bootstrap.sh")
    tag = f"{os.getpid() % 100000}"
    octet = 100 + os.getpid() % 100
    # Squid runs as its own user: its folders must be reachable by it (pytest's are mode 0700).
    base = Path(tempfile.mkdtemp(prefix="sfeg-test-", dir="/tmp"))
    os.chmod(base, 0o755)
    folder = base / "service"
    service = TestService.start(folder, tag, octet)
    dns = TestDNSServer(owned_targets.resolver).start()
    destinations = destination_names(owned_targets, f"10.213.{octet}.1")
    dst_port = free_port_everywhere(["127.0.0.1", *owned_targets.targets.values()])
    with open(service.hosts_file, "a") as hosts:
        hosts.write("".join(f"{address} {name}\n" for name, address in destinations.items()))
    env = {
        "SANDFLEET_EGRESS_NETWORK": f"sfeg-test-{tag}",
        "SANDFLEET_EGRESS_BRIDGE": f"sfegt{tag}"[:15],
        "SANDFLEET_EGRESS_SUBNET": f"10.213.{octet}.0/24",
        "SANDFLEET_EGRESS_STATE_DIR": str(base / "state"),
        "SANDFLEET_EGRESS_HOSTS_FILE": str(service.hosts_file),
        "SANDFLEET_POLICY_NETWORKS": "none,restricted",
        "SANDFLEET_POLICY_ALLOW_HOSTS": "api.egress.test,other.egress.test,mirror.egress.test,"
        f"*.egress.test:8443,*.{DESTINATION_DOMAIN}:{dst_port}",
        "SANDFLEET_EGRESS_DNS_SERVERS": owned_targets.resolver,
        "SANDFLEET_EGRESS_ALLOW_DESTINATIONS": f"{service.address}/32,{owned_targets.private_b}/32",
        # The private mirror (a PEP 503 index on the test service) and the CA restricted sandboxes trust.
        "SANDFLEET_EGRESS_PIP_INDEX_URL": "https://mirror.egress.test/simple",
        "SANDFLEET_EGRESS_CA_FILE": str(service.ca),
    }
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    get_settings.cache_clear()
    gateway_module._gateway.cache_clear()
    try:
        yield {
            "service": service,
            "env": env,
            "octet": octet,
            "dns": dns,
            "dst_port": dst_port,
            "destinations": destinations,
        }
    finally:
        _tear_down(gateway_module.egress_gateway())
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        get_settings.cache_clear()
        gateway_module._gateway.cache_clear()
        dns.stop()
        service.stop()
        shutil.rmtree(base, ignore_errors=True)


def _tear_down(gateway: Any) -> None:
    from sandfleet.worker.egress.network import remove_host_rules
    from sandfleet.worker.egress.squid import stop_proxy
    from sandfleet.worker.sandbox.docker.backend import docker_client

    stop_proxy(gateway.proxy)
    remove_host_rules(gateway.network)
    try:
        docker_client().api.remove_network(gateway.network.name)
    except Exception:
        pass


@pytest.fixture(scope="package")
def service(egress_env: dict[str, Any]) -> TestService:
    return egress_env["service"]


@pytest.fixture
def ca_pem(service: TestService) -> str:
    return Path(service.ca).read_text()
