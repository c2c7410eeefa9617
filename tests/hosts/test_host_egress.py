"""Network "restricted" on a host of the multi-host fleet: the host's own Squid, in its namespace.

A plain HTTP service runs in the control namespace on the fleet's service address; host 1's proxy
resolves ``api.hosts.test`` and ``other.hosts.test`` to it, and ``redis.hosts.test`` to Redis's
address, from the run's hosts file. A job allowed ``api.hosts.test:8080`` and
``redis.hosts.test:8080`` reaches the service through the proxy; ``other.hosts.test`` is refused by
the proxy's allow-list, ``redis.hosts.test`` by its destination filter (a private address), and both
are listed in the result's network denials. The proxy's process lives in host 1's network namespace,
whose only addresses are the run's private range (no default route), and its log shows the service's
address as where it connected.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from reliability.harness import wait_for

from sandfleet.core.contracts import JobStatus
from sandfleet.fleet import netns
from sandfleet.fleet.hosts import HostFleet

pytestmark = [pytest.mark.slow]  # ~30 s: an engine, a worker and a Squid start

FETCH = """\
import json, urllib.request
answers = {}
for host in ("api.hosts.test", "other.hosts.test", "redis.hosts.test"):
    try:
        with urllib.request.urlopen(f"http://{host}:8080/hello", timeout=20) as reply:
            answers[host] = reply.read().decode()
    except Exception as e:  # the proxy's 403
        answers[host] = "refused: " + str(e)
print("RESULT: " + json.dumps(answers))
"""


def test_a_restricted_job_goes_through_its_hosts_own_proxy(
    host_fleet: Callable[..., HostFleet], tmp_path: Path
) -> None:
    """Issue 24 point 1: each host its own egress proxy where restricted networks are used."""
    site = tmp_path / "site"
    site.mkdir(mode=0o755)
    (site / "hello").write_text("hello from the control namespace")
    fleet = host_fleet(
        1,
        egress=True,
        SANDFLEET_POLICY_NETWORKS="none,restricted",
        SANDFLEET_POLICY_ALLOW_HOSTS="*.hosts.test:8080",
    )
    service = fleet.service_address
    redis_address = f"{service.rsplit('.', 1)[0]}.1"  # the control namespace's Redis
    names = f"{service} api.hosts.test\n{service} other.hosts.test\n{redis_address} redis.hosts.test\n"
    fleet.egress_hosts_file.write_text(names)
    server = subprocess.Popen(
        [*netns.enter(fleet.control), sys.executable, "-m", "http.server", "8080", "--bind", service,
         "--directory", str(site)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        assert wait_for(lambda: _answers(service, 8080), 20), "the test service does not answer"
        script = fleet.scripts_dir / "fetch.json"
        script.write_text(json.dumps({"rules": [], "default": [f"```python\n{FETCH}```\n"] * 3}))
        sandbox = {
            "backend": "docker",
            "network": "restricted",
            "allow_hosts": ["api.hosts.test:8080", "redis.hosts.test:8080"],
        }
        with fleet.client() as client:
            job = client.submit("Fetch both", model=f"replay:{script}", sandbox=sandbox)
            result = job.result(timeout=120)
    finally:
        server.kill()
        server.wait()
    assert result.status == JobStatus.SUCCEEDED, (result.error, fleet.host_workers[1].log()[-3000:])
    answers = json.loads(result.result) if isinstance(result.result, str) else result.result
    proxy = fleet.base / "h1" / "egress" / "sandfleet-egress"
    access = (proxy / "access.log").read_text()
    assert answers["api.hosts.test"] == "hello from the control namespace", (answers, access)
    assert answers["other.hosts.test"] == "refused: HTTP Error 403: Forbidden", answers
    assert answers["redis.hosts.test"] == "refused: HTTP Error 403: Forbidden", answers
    denied = {d.host: (d.port, d.reason) for d in result.network_denied}
    assert denied.keys() == {"other.hosts.test", "redis.hosts.test"}, result.network_denied
    assert denied["other.hosts.test"] == (8080, "the name is not in the allow-list")
    assert "private" in denied["redis.hosts.test"][1], denied  # the proxy's destination filter
    assert f"HIER_DIRECT/{service} " in access, access  # Squid connected to the service, in the range
    squid = int((proxy / "squid.pid").read_text().split()[0])
    assert squid in netns.processes_in(fleet.namespace(1))  # host 1's own proxy, in its namespace


def _answers(address: str, port: int) -> bool:
    try:
        socket.create_connection((address, port), timeout=1).close()
    except OSError:
        return False
    return True
