"""A multi-host fleet whose Redis is secured as across real hosts (issue 24 point 4): TLS only, a CA
of the run's own, an ACL user per role (deploy/redis-acl.conf), each party holding its own role's
password only. Jobs run through it exactly once; a plain connection, another CA, a worker's admin
command and an auditor's write are refused by Redis itself."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path

import pytest
import redis

from sandfleet.core.contracts import JobStatus
from sandfleet.core.redis_connect import connect
from sandfleet.core.settings import Settings
from sandfleet.fleet.hosts import REDIS_PORT, HostFleet
from sandfleet.fleet.redis_security import ADMIN, make_ca_and_cert

pytestmark = [pytest.mark.slow]  # two engines and workers start


def environ(pid: int) -> dict[str, str]:
    pairs = (item.split("=", 1) for item in Path(f"/proc/{pid}/environ").read_bytes().decode().split("\0"))
    return {pair[0]: pair[1] for pair in pairs if len(pair) == 2}


def test_a_secured_fleet_runs_jobs_over_tls_with_a_user_per_role(
    host_fleet: Callable[..., HostFleet], tmp_path: Path
) -> None:
    fleet = host_fleet(2, secured=True)
    security = fleet.security
    assert security is not None
    script = fleet.scripts_dir / "sum.json"
    script.write_text(json.dumps({"rules": [], "default": ["```python\nprint('RESULT:', 6 * 7)\n```"]}))
    with fleet.client() as client:
        batch = client.submit_batch([{"question": f"q{i}", "model": f"replay:{script}"} for i in range(4)])
        results = batch.wait(timeout=120)
        assert [r.status for r in results] == [JobStatus.SUCCEEDED] * 4, [r.error for r in results]
        assert [r.result for r in results] == [42] * 4
        job_id = results[0].job_id

    # Each worker holds the worker user's URL and the CA, nobody else's password.
    for worker in fleet.host_workers.values():
        env = environ(worker.process.pid)
        assert env["SANDFLEET_REDIS_URL"].startswith("rediss://worker:")
        assert env["SANDFLEET_REDIS_CA_FILE"] == str(security.ca)
        for role in ("producer", "auditor", ADMIN):
            assert security.passwords[role] not in "\0".join(env.values()), role

    address = f"{security.address}:{REDIS_PORT}"
    # No plain port: a client without TLS gets no answer from the fleet's Redis.
    plain = redis.Redis.from_url(f"redis://{address}/0", socket_connect_timeout=2, socket_timeout=2)
    with pytest.raises(redis.ConnectionError):
        plain.ping()
    plain.close()
    # TLS verifies the server: a client trusting another CA is refused before it speaks.
    other_ca, _, _ = make_ca_and_cert(tmp_path, "other", security.address)
    stranger = connect(fleet.role_settings("producer").redis_url, Settings(redis_ca_file=str(other_ca)))
    with pytest.raises(redis.ConnectionError, match="certificate verify failed"):
        stranger.ping()
    stranger.close()
    # The ACL users: a worker cannot reconfigure Redis, an auditor reads records and writes none.
    worker = connect(fleet.role_settings("worker").redis_url, fleet.role_settings("worker"))
    auditor = connect(fleet.role_settings("auditor").redis_url, fleet.role_settings("auditor"))
    try:
        with pytest.raises(redis.exceptions.NoPermissionError, match=re.escape("'config|get'")):
            worker.config_get("dir")
        record = auditor.hgetall(f"{fleet.key_prefix}:job:{job_id}")
        assert record.get("status") == "succeeded"
        with pytest.raises(redis.exceptions.NoPermissionError, match="'hset'"):
            auditor.hset(f"{fleet.key_prefix}:job:{job_id}", "status", "failed")
    finally:
        worker.close()
        auditor.close()
