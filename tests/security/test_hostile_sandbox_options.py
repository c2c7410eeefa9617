"""Widening a job's sandbox past the operator's policy, as a submitter types it and as whoever can write
Redis forges it (issue 22, rows 1 and 8), through real ``sandfleet worker`` processes and ``sandfleet
replay``. What each sandbox got is what its program reports: uid, whether / is writable, interfaces.

- A submitter: ``sandfleet submit ... -o allow_sudo=true -o read_only_rootfs=false`` and every other
  widening option, in every mode, to a worker with the default policy: refused naming the option and
  its SANDFLEET_POLICY_* variable, no model call, and no container created (``docker events`` filtered
  by the worker's owner label, as in test_hostile_input.py).
- An operator who allows sudo, a writable root, full network, an env name and a workdir (the worker's
  environment says so, explicitly): the same options run, uid 0 on a writable root, under runc and
  gVisor; jobs that ask for nothing still get the locked-down sandbox, and the operator's CPU
  ceiling still holds.
- Whoever can write Redis: genuine jobs' records rewritten to network full (and allow_sudo and a
  writable root), their chains re-signed with a key the attacker registered in the fleet's key
  register, so they verify against it (the strongest forgery without a worker's key: SECURITY.md).
  ``sandfleet replay`` and ``replay --batch`` on the auditor's machine: refused under its default
  policy, no container made; allowed there, run, but with network none.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import pytest
import redis
from sandfleet_testing.workers import SANDFLEET, FleetWorker, WorkerFactory

from sandfleet.core.chain import GENESIS_HASH, canonical_json, link_hash, sha256_hex, signed_message
from sandfleet.core.key_registry import KeyRegistry
from sandfleet.core.redis_keys import FleetKeys
from sandfleet.core.settings import Settings
from sandfleet.core.signing import WorkerKey

from .helpers import ContainerWatch, record, skip_or_fail

JOB_TIMEOUT_S = 120.0
BACKENDS = ("docker", "gvisor")
RUNTIME_OF = {"docker": "runc", "gvisor": "runsc"}
ATTACKER = "attacker@redis-writer"
PROBE = """import json, os
try:
    with open("/sandfleet-probe", "w") as f:
        f.write("written")
    root_writable = True
except OSError:
    root_writable = False
print("RESULT: " + json.dumps({
    "uid": os.getuid(),
    "root_writable": root_writable,
    "interfaces": sorted(os.listdir("/sys/class/net")),
    "cwd": os.getcwd(),
    "greeting": os.environ.get("GREETING"),
}))
"""
LOCKED_DOWN = {
    "uid": 10001,
    "root_writable": False,
    "interfaces": ["lo"],
    "cwd": "/workspace",
    "greeting": None,
}
# The operator of the lenient worker, as its environment spells it.
LENIENT_POLICY = {
    "SANDFLEET_POLICY_ALLOW_SUDO": "true",
    "SANDFLEET_POLICY_ALLOW_WRITABLE_ROOTFS": "true",
    "SANDFLEET_POLICY_NETWORKS": "none,full",
    "SANDFLEET_POLICY_ENV_NAMES": "GREETING",
    "SANDFLEET_POLICY_WORKDIRS": "/workspace,/data",
    "SANDFLEET_POLICY_MAX_CPUS": "1",  # SandboxConfig refuses more CPUs than the host has: a ceiling below
}


@dataclass
class Fleet:
    worker: FleetWorker
    settings: Settings
    model: str
    watch: ContainerWatch

    def cli(self, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
        return sandfleet(self.settings, *args, **env)


def sandfleet(settings: Settings, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    """``sandfleet ARGS`` as a user runs it: the fleet's Redis and prefix, no other SANDFLEET_ variable."""
    return subprocess.run(
        [SANDFLEET, *args],
        env=cli_env(settings, **env),
        capture_output=True,
        text=True,
        timeout=JOB_TIMEOUT_S * 2,
    )


def cli_env(settings: Settings, **env: str) -> dict[str, str]:
    return {
        **{k: v for k, v in os.environ.items() if not k.startswith("SANDFLEET_")},
        "SANDFLEET_REDIS_URL": settings.redis_url,
        "SANDFLEET_KEY_PREFIX": settings.key_prefix,
        **env,
    }


def submitted(fleet: Fleet, *options: str) -> dict[str, Any]:
    """``sandfleet submit probe --model M OPTIONS --wait --json``: the JobResult it printed."""
    done = fleet.cli(
        "submit",
        "probe the sandbox",
        "--model",
        fleet.model,
        *options,
        "--wait",
        "--json",
        "--timeout",
        str(JOB_TIMEOUT_S),
    )
    assert done.stdout.strip(), (done.returncode, done.stderr[-2000:], fleet.worker.log()[-3000:])
    result = json.loads(done.stdout)
    assert done.returncode == (0 if result["status"] == "succeeded" else 1), (done.returncode, done.stderr)
    return result


def start_fleet(start: WorkerFactory, name: str, env: dict[str, str] | None = None) -> Fleet:
    """A worker whose replay model answers every job with PROBE, and a watch on its containers."""
    from sandfleet.worker.sandbox.docker.spec import Owner, process_start_ticks

    # No warming beyond demand: every container a watch sees is one a job asked for.
    worker = start(
        name,
        sandboxes=2,
        script={"default": [f"```python\n{PROBE}```"]},
        env={"SANDFLEET_POOL_FOLLOWS_DEMAND": "false", **(env or {})},
    )
    pid = worker.process.pid
    owner = Owner(socket.gethostname(), pid, process_start_ticks(pid) or 0).label()
    return Fleet(worker, worker.settings, worker.model, ContainerWatch(owner))


def require_gvisor(docker_engine: Any) -> None:
    if "runsc" not in docker_engine.runtimes or "runsc-net" not in docker_engine.runtimes:
        skip_or_fail("gVisor's runsc and runsc-net runtimes are not registered (deploy/bootstrap.sh)")


@pytest.fixture(scope="module")
def strict(module_fleet_worker: WorkerFactory, docker_engine: Any) -> Iterator[Fleet]:
    """A worker with the default operator policy."""
    require_gvisor(docker_engine)
    fleet = start_fleet(module_fleet_worker, "strict")
    try:
        yield fleet
    finally:
        fleet.watch.close()


@pytest.fixture(scope="module")
def lenient(module_fleet_worker: WorkerFactory, docker_engine: Any) -> Iterator[Fleet]:
    """A worker whose operator allows sudo, a writable root, full network, GREETING and /data."""
    require_gvisor(docker_engine)
    fleet = start_fleet(module_fleet_worker, "lenient", LENIENT_POLICY)
    try:
        yield fleet
    finally:
        fleet.watch.close()


# ---- a submitter, at the command line ---------------------------------------------------------------
SUDO = "sandbox allow_sudo is not allowed by the operator (SANDFLEET_POLICY_ALLOW_SUDO=false)"
ROOTFS = "sandbox read_only_rootfs=false is not allowed by the operator (SANDFLEET_POLICY_ALLOW_WRITABLE_ROOTFS=false)"
WIDENING_OPTIONS: dict[str, tuple[list[str], list[str]]] = {
    "sudo on a writable root": (["-o", "allow_sudo=true", "-o", "read_only_rootfs=false"], [SUDO, ROOTFS]),
    "sudo, shell mode": (["--mode", "shell", "-o", "allow_sudo=true"], [SUDO]),
    "sudo, chat mode": (["--mode", "chat", "-o", "allow_sudo=true"], [SUDO]),
    "writable root, gVisor": (["-o", "backend=gvisor", "-o", "read_only_rootfs=false"], [ROOTFS]),
    "a runtime of its choosing": (
        ["-o", "runtime=io.containerd.runc.v2"],
        [
            "sandbox runtime 'io.containerd.runc.v2' is not allowed by the operator (SANDFLEET_POLICY_RUNTIMES=runc,runsc,runsc-net,runsc-egress)"
        ],
    ),
    "env": (
        ["-o", 'env={"LD_PRELOAD": "/workspace/x.so"}'],
        ["sandbox env LD_PRELOAD is not allowed by the operator (SANDFLEET_POLICY_ENV_NAMES is empty)"],
    ),
    "workdir over /etc": (
        ["-o", "workdir=/etc"],
        ["sandbox workdir '/etc' is not allowed by the operator (SANDFLEET_POLICY_WORKDIRS=/workspace)"],
    ),
    "persistent": (
        ["-o", "persistent=true"],
        ["sandbox persistent is not allowed: jobs run in single-use sandboxes"],
    ),
    "memory": (
        ["-o", "memory_limit=16G"],
        ["sandbox memory_limit 16G is above the operator's ceiling of 8G (SANDFLEET_POLICY_MAX_MEMORY)"],
    ),
    "disk": (
        ["-o", "disk_limit=4G"],
        ["sandbox disk_limit 4G is above the operator's ceiling of 2G (SANDFLEET_POLICY_MAX_DISK)"],
    ),
    "pids": (
        ["-o", "pids_limit=4096"],
        ["sandbox pids_limit 4096 is above the operator's ceiling of 512 (SANDFLEET_POLICY_MAX_PIDS)"],
    ),
    "timeout": (
        ["-o", "timeout=1200"],
        [
            "sandbox timeout 1200 s is above the operator's ceiling of 600 s (SANDFLEET_POLICY_MAX_SANDBOX_TIMEOUT_S)"
        ],
    ),
    "network full": (
        ["-o", "network=full"],
        ["sandbox network 'full' is not allowed by the operator (SANDFLEET_POLICY_NETWORKS=none)"],
    ),
    "image": (
        ["-o", "image=alpine:latest"],
        [
            "sandbox image 'alpine:latest' is not allowed by the operator (SANDFLEET_POLICY_IMAGES=sandfleet/sandbox:py3.11,"
        ],
    ),
}


def test_each_widening_option_from_the_cli_is_refused_naming_its_variable_before_any_container(
    strict: Fleet,
) -> None:
    before = strict.watch.created()
    with ThreadPoolExecutor(max_workers=4) as submitters:
        futures = {
            case: submitters.submit(submitted, strict, *opts) for case, (opts, _) in WIDENING_OPTIONS.items()
        }
        results = {case: future.result() for case, future in futures.items()}
    time.sleep(1.0)  # events reach the watch within moments
    created_while_refusing = [c for c in strict.watch.created() if c not in before]

    for case, result in results.items():
        assert result["status"] == "refused", (case, result["status"], result["error"])
        assert result["error"]["kind"] == "refused"
        for expected in WIDENING_OPTIONS[case][1]:
            assert expected in result["error"]["message"], (case, result["error"]["message"])
        assert result["usage"]["model_calls"] == 0 and result["attempts"] == [], case
    assert created_while_refusing == [], f"containers were created for refused jobs: {created_while_refusing}"

    # The watch sees this worker's containers: the same question with no option runs, locked down.
    control = submitted(strict)
    assert control["status"] == "succeeded" and control["result"] == LOCKED_DOWN, control
    deadline = time.monotonic() + 10
    while len(strict.watch.created()) == len(before) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert len(strict.watch.created()) > len(before), (
        "the container watch saw nothing: it would prove nothing"
    )
    for case, result in results.items():
        record(f"sandbox option from the CLI: {case}", "worker", True, result["error"]["message"][:300])


# ---- an operator who allows it ----------------------------------------------------------------------
@pytest.mark.parametrize("backend", BACKENDS)
def test_an_operator_who_allows_sudo_and_a_writable_root_gets_them(lenient: Fleet, backend: str) -> None:
    # Full network under runc only: gVisor's runsc-net does not start on this kind of host ("cannot run
    # with network enabled in root network namespace"), whoever allows it.
    network = ["-o", "network=full"] if backend == "docker" else []
    asked = [
        "-o", f"backend={backend}", "-o", "allow_sudo=true", "-o", "read_only_rootfs=false", *network,
        "-o", 'env={"GREETING": "hello"}', "-o", "workdir=/data", "-o", "cpu_limit=1",
    ]  # fmt: skip
    widened = submitted(lenient, *asked)
    plain = submitted(lenient, "-o", f"backend={backend}", "-o", "cpu_limit=1")
    over_the_ceiling = submitted(lenient, *asked[:-1], "cpu_limit=2")

    assert widened["status"] == "succeeded", (widened["error"], lenient.worker.log()[-3000:])
    got = widened["result"]
    assert (got["uid"], got["root_writable"], got["cwd"], got["greeting"]) == (0, True, "/data", "hello"), got
    if network:  # the probe does see a network when there is one
        assert "lo" in got["interfaces"] and len(got["interfaces"]) > 1, got
    else:
        assert got["interfaces"] == ["lo"], got
    assert plain["status"] == "succeeded" and plain["result"] == LOCKED_DOWN, plain  # allowed is not default
    assert over_the_ceiling["status"] == "refused" and over_the_ceiling["usage"]["model_calls"] == 0
    assert over_the_ceiling["error"]["message"] == (
        "sandbox cpu_limit 2 is above the operator's ceiling of 1 (SANDFLEET_POLICY_MAX_CPUS)"
    )
    record(
        "sandbox options allowed by the operator",
        RUNTIME_OF[backend],
        True,
        {"widened": got, "plain": plain["result"]},
    )


# ---- whoever can write Redis, and the auditor's replay ---------------------------------------------
ROOT_ON_FULL_NETWORK = {"network": "full", "allow_sudo": True, "read_only_rootfs": False}


@dataclass
class Forged:
    fleet: Fleet
    batch_id: str
    root: dict[str, str]  # backend -> job forged to network full, allow_sudo, writable root
    net: dict[str, str]  # backend -> job forged to network full only
    served: dict[str, Any]  # what the genuine runs printed (and the forged records still serve)


def forge_sandbox(
    r: redis.Redis, keys: FleetKeys, job_id: str, sandbox: dict[str, Any], attacker: WorkerKey
) -> None:
    """Rewrite a finished job's spec to ``sandbox`` and make its chain agree, as a Redis writer can: the
    spec digests in the queued and running events, every link, the worker named (the attacker's), each
    entry after the producer's re-signed with the attacker's registered key, the record's tip and count."""
    record_ = r.hgetall(keys.job(job_id))
    spec = json.loads(record_["spec"])
    spec["sandbox"] = sandbox
    spec_json = json.dumps(spec)
    digest, genuine = sha256_hex(spec_json), record_["worker"]
    prev, entries = GENESIS_HASH, []
    for index, (_id, fields) in enumerate(r.xrange(keys.audit(job_id))):
        event = json.loads(fields["event"])
        if "spec_sha256" in event["data"]:
            event["data"]["spec_sha256"] = digest
        if event["data"].get("worker") == genuine:
            event["data"]["worker"] = ATTACKER
        event_json = canonical_json(event)
        link = link_hash(prev, event_json)
        entry = {"event": event_json, "hash": link, "sig": "", "key": ""}
        if index > 0:
            entry.update(sig=attacker.sign(signed_message(job_id, link)), key=attacker.key_id)
        entries.append(entry)
        prev = link
    pipe = r.pipeline(transaction=True)
    pipe.delete(keys.audit(job_id))
    for entry in entries:
        pipe.xadd(keys.audit(job_id), entry)
    pipe.hset(
        keys.job(job_id),
        mapping={"spec": spec_json, "worker": ATTACKER, "audit_head": prev, "audit_count": str(len(entries))},
    )
    pipe.execute()


@pytest.fixture(scope="module")
def forged(strict: Fleet) -> Iterator[Forged]:
    """A batch of genuine probe jobs per backend, run by the strict worker, then forged."""
    client = strict.worker.client
    specs = [
        {"question": "probe the sandbox", "model": strict.model, "sandbox": {"backend": b}}
        for b in BACKENDS
        for _ in (1, 2)
    ]
    batch = client.submit_batch(specs)
    results = [job.result(timeout=JOB_TIMEOUT_S) for job in batch.jobs()]
    assert all(r.status.value == "succeeded" for r in results), [(r.status, r.error) for r in results]
    assert {json.dumps(r.result, sort_keys=True) for r in results} == {
        json.dumps(LOCKED_DOWN, sort_keys=True)
    }
    ids = [job.job_id for job in batch.jobs()]
    root = {"docker": ids[0], "gvisor": ids[2]}
    net = {"docker": ids[1], "gvisor": ids[3]}
    r = redis.Redis.from_url(strict.settings.redis_url, decode_responses=True)
    keys = FleetKeys(strict.settings.key_prefix)
    attacker = WorkerKey.generate(ATTACKER)
    KeyRegistry(r, keys).register(attacker.info)  # what any Redis writer can do
    for backend in BACKENDS:
        forge_sandbox(r, keys, root[backend], {"backend": backend, **ROOT_ON_FULL_NETWORK}, attacker)
        forge_sandbox(r, keys, net[backend], {"backend": backend, "network": "full"}, attacker)
    r.close()
    for job_id in [*root.values(), *net.values()]:  # the forgery holds: verified with the Redis register
        audited = strict.cli("audit", job_id, "--verify")
        assert audited.returncode == 0, (audited.stdout, audited.stderr)
        assert client.get(job_id).record().spec.sandbox in (  # type: ignore[union-attr]
            {"backend": b, **extra} for b in BACKENDS for extra in (ROOT_ON_FULL_NETWORK, {"network": "full"})
        )
    yield Forged(strict, batch.batch_id, root, net, LOCKED_DOWN)


def replayed(
    forged: Forged, *args: str, **env: str
) -> tuple[subprocess.CompletedProcess[str], list[dict[str, Any]]]:
    """``sandfleet replay ARGS --json`` as the auditor runs it (its own policy: ``env``), and the
    containers that replay process created (``docker events``, by its owner label)."""
    watch = ContainerWatch(None)
    try:
        process = subprocess.Popen(
            [SANDFLEET, "replay", *args, "--json"],
            env=cli_env(forged.fleet.settings, **env),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        stdout, stderr = process.communicate(timeout=JOB_TIMEOUT_S * 2)
        time.sleep(1.0)  # events reach the watch within moments
        created = watch.created_events(process.pid)
    finally:
        watch.close()
    return subprocess.CompletedProcess(process.args, process.returncode, stdout, stderr), created


AUDITOR_ALLOWS_EVERYTHING = {
    "SANDFLEET_POLICY_ALLOW_SUDO": "true",
    "SANDFLEET_POLICY_ALLOW_WRITABLE_ROOTFS": "true",
    "SANDFLEET_POLICY_NETWORKS": "none,restricted,full",
}


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_forged_root_sandbox_is_refused_by_the_auditors_policy_and_no_container_starts(
    forged: Forged, backend: str
) -> None:
    done, created = replayed(forged, forged.root[backend])

    assert done.returncode == 1, (done.stdout, done.stderr)
    outcome = json.loads(done.stdout)
    assert outcome["state"] == "refused" and outcome["verified"] is True, outcome
    assert outcome["reason"] == f"{SUDO}; {ROOTFS}", outcome
    assert outcome["replayed"] is None
    assert created == [], f"the refused replay created containers: {created}"
    record(
        "replay of a forged sudo/writable-root/full-network job", RUNTIME_OF[backend], True, outcome["reason"]
    )


@pytest.mark.parametrize("backend", BACKENDS)
def test_allowed_locally_the_forged_sandbox_runs_but_with_network_none(forged: Forged, backend: str) -> None:
    done, created = replayed(forged, forged.root[backend], **AUDITOR_ALLOWS_EVERYTHING)

    outcome = json.loads(done.stdout)
    assert outcome["state"] == "different" and outcome["verified"] is True, (outcome, done.stderr[-2000:])
    # root on a writable root, as this auditor allows; but no network, though it allows full.
    assert outcome["replayed"] == {**LOCKED_DOWN, "uid": 0, "root_writable": True}, outcome
    assert outcome["served"] == forged.served
    assert len(created) == 1, created
    record(
        "replay of a forged full-network job, allowed sudo locally",
        RUNTIME_OF[backend],
        True,
        outcome["replayed"],
    )


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_forged_full_network_replays_with_network_none(forged: Forged, backend: str) -> None:
    done, created = replayed(forged, forged.net[backend])

    outcome = json.loads(done.stdout)
    assert done.returncode == 0 and outcome["state"] == "match", (outcome, done.stderr[-2000:])
    assert (
        outcome["replayed"] == LOCKED_DOWN
    )  # interfaces: lo only, the record's network full notwithstanding
    assert len(created) == 1, created


def test_a_forged_batch_replays_under_the_local_policy(forged: Forged) -> None:
    from sandfleet.worker.sandbox.policy import replay_sandbox

    done, created = replayed(forged, "--batch", forged.batch_id)

    lines = [json.loads(line) for line in done.stdout.splitlines()]
    outcomes, summary = {o["job_id"]: o for o in lines[:-1]}, lines[-1]["summary"]
    assert done.returncode == 1, (done.stdout, done.stderr[-2000:])
    for backend in BACKENDS:
        refused, narrowed = outcomes[forged.root[backend]], outcomes[forged.net[backend]]
        assert refused["state"] == "refused" and refused["reason"] == f"{SUDO}; {ROOTFS}", refused
        assert narrowed["state"] == "match" and narrowed["replayed"] == LOCKED_DOWN, narrowed
    assert "2 match, 0 different, 0 unverified" in summary and "2 refused" in summary, summary
    # Warming included, every container the replay made has a narrowed config the local policy allows.
    allowed = {replay_sandbox({"backend": b, "network": "full"}, Settings()).fingerprint() for b in BACKENDS}
    configs = {e["Actor"]["Attributes"].get("sandfleet.config") for e in created}
    assert created and configs <= allowed, (configs, allowed)
    record("replay --batch of forged jobs", "runc+runsc", True, summary)
