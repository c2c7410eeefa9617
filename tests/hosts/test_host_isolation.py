"""A worker host cannot see another host's containers or Docker socket (SECURITY.md).

Run as host 1's worker runs (its namespace, its group, no capabilities), a probe tries host 2's
socket, the machine's own socket, host 2's engine folder and host 2's dockerd's root through /proc;
each must be refused, while host 1's own socket answers. A second probe lists host 1's engine: host
2's running container is not on it.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable

import pytest
from reliability.harness import sleeper_script, wait_for

from sandfleet.fleet.hosts import HostFleet

pytestmark = [pytest.mark.slow]  # ~50 s: two engines and workers start

PROBE = """
import json, os, sys, docker
own, other, engine_dir, dockerd = sys.argv[1:5]
out = {}
def attempt(name, f):
    try:
        f(); out[name] = "allowed"
    except Exception as e:
        out[name] = type(e).__name__
attempt("own_socket", lambda: docker.DockerClient(base_url=own).ping())
attempt("other_socket", lambda: docker.DockerClient(base_url=other).ping())
attempt("machine_socket", lambda: docker.DockerClient(base_url="unix:///var/run/docker.sock").ping())
attempt("other_engine_folder", lambda: os.listdir(engine_dir))
attempt("other_dockerd_root", lambda: os.listdir(f"/proc/{dockerd}/root/"))
out["own_containers"] = [c.id for c in docker.DockerClient(base_url=own).containers.list(all=True)]
print(json.dumps(out))
"""


def test_a_host_cannot_open_another_hosts_socket_or_see_its_containers(
    host_fleet: Callable[..., HostFleet],
) -> None:
    fleet = host_fleet(2)
    model = f"replay:{sleeper_script(fleet.scripts_dir, 20)}"
    with fleet.client() as client:
        jobs = [client.submit(f"Sleep {i}", model=model) for i in range(4)]
    assert wait_for(lambda: bool(fleet.engines[2].sandboxes()), 60), "no container on host 2"
    other = fleet.engines[2]
    assert other.process is not None
    argv = [
        sys.executable,
        "-c",
        PROBE,
        fleet.engines[1].url,
        other.url,
        str(other.folder),
        str(other.process.pid),
    ]
    done = subprocess.run(fleet.as_host(1, argv), capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout)
    assert seen["own_socket"] == "allowed", seen
    for attack in ("other_socket", "machine_socket", "other_engine_folder", "other_dockerd_root"):
        assert seen[attack] != "allowed", (attack, seen)
    assert not set(seen["own_containers"]) & set(other.sandboxes()), seen
    for job in jobs:
        job.cancel()
