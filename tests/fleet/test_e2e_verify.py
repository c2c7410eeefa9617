"""Verifying and replaying whole batches run by two real workers, audit bundles checked offline, and
the rotation of a running worker's key: real ``sandfleet worker`` processes, Docker sandboxes, the
replay model over HTTP, the ``sandfleet`` commands as a user runs them."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from sandfleet.core.errors import UnverifiedResultError
from sandfleet.core.settings import Settings
from sandfleet.producer.cli.jobs import write_results

from .helpers import JOB_TIMEOUT_S, SANDFLEET, FleetWorker, WorkerFactory, free_port, stop_worker

TRIVIAL = '```python\nprint("RESULT: " + str(6 * 7))\n```'
RANDOM = '```python\nimport random\nprint("RESULT: " + str(random.random()))\n```'
BATCH_SIZE = 16


@dataclass
class TwoWorkers:
    settings: Settings
    workers: list[FleetWorker]
    model: str
    folder: Path

    @property
    def client(self):  # type: ignore[no-untyped-def]
        return self.workers[0].client


def write_script(folder: Path, latency_s: float) -> str:
    script = {"rules": [{"match": "(?i)random", "responses": [RANDOM]}], "default": [TRIVIAL]}
    path = folder / "script.json"
    path.write_text(json.dumps(script))
    return f"replay:{path}?latency={latency_s:g}"


def cli(settings: Settings, *args: str, **extra: str) -> subprocess.CompletedProcess[str]:
    """``sandfleet ARGS`` with the fleet's settings only (no inherited SANDFLEET_ variables)."""
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("SANDFLEET_")},
        "SANDFLEET_REDIS_URL": settings.redis_url,
        "SANDFLEET_KEY_PREFIX": settings.key_prefix,
        **extra,
    }
    return subprocess.run(
        [SANDFLEET, *args], env=env, capture_output=True, text=True, timeout=JOB_TIMEOUT_S * 2
    )


@pytest.fixture(scope="module")
def two(module_fleet_worker: WorkerFactory, tmp_path_factory: pytest.TempPathFactory) -> TwoWorkers:
    """Two workers of one fleet (one key prefix), sharing one replay scripts folder."""
    folder = tmp_path_factory.mktemp("two-workers")
    scripts = folder / "scripts"  # both workers' SANDFLEET_REPLAY_SCRIPTS_DIR
    first = module_fleet_worker("w0", concurrency=4, sandboxes=2, replay_scripts_dir=scripts)
    second = module_fleet_worker(
        "w1", settings=first.settings, concurrency=4, sandboxes=2, replay_scripts_dir=scripts
    )
    # Each model call takes 0.3 s, so both workers, four jobs at a time each, share the batch.
    return TwoWorkers(first.settings, [first, second], write_script(scripts, 0.3), folder)


@pytest.fixture(scope="module")
def batch_id(two: TwoWorkers) -> str:
    questions = [{"question": f"six times seven, copy {i}", "model": two.model} for i in range(BATCH_SIZE)]
    batch = two.client.submit_batch(questions)
    batch.wait(timeout=JOB_TIMEOUT_S * 2)
    return batch.batch_id


def test_a_batch_run_by_two_workers_verifies_in_one_command(two: TwoWorkers, batch_id: str) -> None:
    report = two.client.batch(batch_id).verify()
    assert report.verified and len(report.verdicts) == BATCH_SIZE, report.summary()
    signers = {worker for v in report.verdicts for worker in v.signers.values()}
    assert len(signers) == 2, f"both workers should have run jobs of the batch: {signers}"

    done = cli(two.settings, "audit", "--verify", "--batch", batch_id)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"{BATCH_SIZE} jobs: {BATCH_SIZE} verified, 0 mismatched, 0 unfinished, 0 missing" in done.stdout
    data = json.loads(cli(two.settings, "audit", "--verify", "--batch", batch_id, "--json").stdout)
    assert data["summary"]["verified"] == BATCH_SIZE and all(v["verified"] for v in data["verdicts"])


def test_a_batch_run_by_two_workers_replays_in_one_process(two: TwoWorkers, batch_id: str) -> None:
    from sandfleet.worker.rerun.batch import replay_batch

    done = cli(two.settings, "replay", "--batch", batch_id, "--concurrency", "4")
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    assert f"{BATCH_SIZE} jobs: {BATCH_SIZE} match, 0 different, 0 unverified" in done.stdout
    report = replay_batch(two.settings, batch_id, concurrency=2)  # the same from Python
    assert report.exit_status() == 0 and report.count("match") == BATCH_SIZE
    assert {o.replayed for o in report.outcomes} == {42}
    assert any(o.run is not None and o.run.warm for o in report.outcomes), "replays take warm containers"


def test_one_forged_result_in_a_batch_is_named_and_refused_everywhere(
    two: TwoWorkers, batch_id: str, tmp_path: Path
) -> None:
    r, keys = two.client.redis, two.client.keys
    batch = two.client.batch(batch_id)
    victim = batch.job_ids[3]
    original = r.hget(keys.job(victim), "result")
    forged = json.loads(original)
    forged["result"] = 41
    r.hset(keys.job(victim), "result", json.dumps(forged))
    try:
        audited = cli(two.settings, "audit", "--verify", "--batch", batch_id)
        replayed = cli(two.settings, "replay", "--batch", batch_id)
        with pytest.raises(UnverifiedResultError, match=f"job {victim}"):
            batch.results()
        checked = batch.checked_results()
        rows = [(n, c.job_id, two.client.get(c.job_id).record().spec, c) for n, c in enumerate(checked, 1)]
        write_results(tmp_path / "out.jsonl", rows)
        write_results(tmp_path / "out.csv", rows)
    finally:
        r.hset(keys.job(victim), "result", original)
    assert audited.returncode == 1 and f"{BATCH_SIZE - 1} verified, 1 mismatched" in audited.stdout
    assert f"{victim}  MISMATCHED: " in audited.stdout and "field 'result'" in audited.stdout
    assert (
        replayed.returncode == 1 and f"{BATCH_SIZE - 1} match, 0 different, 1 unverified" in replayed.stdout
    )
    exported = [json.loads(line) for line in (tmp_path / "out.jsonl").read_text().splitlines()]
    bad = [row for row in exported if not row["verified"]]
    assert [row["job_id"] for row in bad] == [victim] and "result" not in bad[0] and bad[0]["problems"]
    assert all(row["result"] == 42 for row in exported if row["verified"])
    with (tmp_path / "out.csv").open() as f:
        [row] = [row for row in csv.DictReader(f) if row["job_id"] == victim]
    assert (
        row["verified"] == "false" and row["result"] == "" and "not proven by the audit chain" in row["error"]
    )
    assert two.client.batch(batch_id).verify().verified  # restored


def test_replay_batch_warms_only_the_sandboxes_of_records_its_chains_prove(
    two: TwoWorkers, batch_id: str
) -> None:
    """The batch's chains are verified in one pass before any replay: a record whose spec was edited
    to ask for another sandbox (here 300M of memory) is unverified, and no container of that config
    starts, not even to warm the pool; every container the replay made is the default replay sandbox,
    warmed while the records were read (issue 25 point 3)."""
    from security.helpers import ContainerWatch

    from sandfleet.worker.sandbox.policy import replay_sandbox

    r, keys = two.client.redis, two.client.keys
    victim = two.client.batch(batch_id).job_ids[5]
    original = r.hget(keys.job(victim), "spec")
    forged = json.loads(original)
    forged["sandbox"] = {**forged.get("sandbox", {}), "memory_limit": "300M"}
    r.hset(keys.job(victim), "spec", json.dumps(forged))
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("SANDFLEET_")},
        "SANDFLEET_REDIS_URL": two.settings.redis_url,
        "SANDFLEET_KEY_PREFIX": two.settings.key_prefix,
    }
    watch = ContainerWatch(None)
    try:
        process = subprocess.Popen(
            [SANDFLEET, "replay", "--batch", batch_id, "--concurrency", "4"],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        stdout, stderr = process.communicate(timeout=JOB_TIMEOUT_S * 2)
        time.sleep(1.0)  # events reach the watch within moments
        created = watch.created_events(process.pid)
    finally:
        watch.close()
        r.hset(keys.job(victim), "spec", original)
    assert process.returncode == 1, stdout[-2000:] + stderr[-3000:]
    assert f"{BATCH_SIZE - 1} match, 0 different, 1 unverified" in stdout, stdout
    assert f"{victim}  unverified: " in stdout, stdout
    default = replay_sandbox({}, two.settings).fingerprint()
    forged_config = replay_sandbox(forged["sandbox"], two.settings).fingerprint()
    configs = [e["Actor"]["Attributes"].get("sandfleet.config") for e in created]
    assert forged_config != default and forged_config not in configs, configs
    assert len(configs) >= BATCH_SIZE - 1 and set(configs) == {default}, configs
    assert two.client.batch(batch_id).verify().verified  # restored


def test_a_program_that_prints_something_else_replays_as_different(two: TwoWorkers) -> None:
    job = two.client.submit({"question": "a random number, please", "model": two.model})
    assert job.result(timeout=JOB_TIMEOUT_S).status == "succeeded"
    done = cli(two.settings, "replay", job.job_id, "--json")
    outcome = json.loads(done.stdout)
    assert done.returncode == 1 and outcome["state"] == "different" and outcome["verified"] is True
    assert outcome["served"] != outcome["replayed"] and "the record serves" in outcome["reason"]


def test_an_exported_bundle_verifies_offline(two: TwoWorkers, batch_id: str, tmp_path: Path) -> None:
    bundle, pinned = tmp_path / "batch.json", tmp_path / "keys.json"
    assert cli(two.settings, "keys", "export", "--out", str(pinned)).returncode == 0
    done = cli(two.settings, "audit", "--batch", batch_id, "--export", str(bundle))
    assert done.returncode == 0 and f"bundle of {BATCH_SIZE} jobs written" in done.stderr, done.stderr
    one = tmp_path / "one.json"
    job_id = two.client.batch(batch_id).job_ids[0]
    assert cli(two.settings, "audit", job_id, "--export", str(one)).returncode == 0

    nowhere = {"SANDFLEET_REDIS_URL": f"redis://127.0.0.1:{free_port()}/0"}  # nothing listens there
    for path in (bundle, one):
        offline = cli(two.settings, "audit", "--verify-file", str(path), "--keys", str(pinned), **nowhere)
        assert offline.returncode == 0, offline.stdout + offline.stderr
        assert "verified, 0 mismatched" in offline.stdout and "the pinned key set" in offline.stderr
    inside = cli(two.settings, "audit", "--verify-file", str(bundle), **nowhere)
    assert inside.returncode == 0 and "keys inside the bundle" in inside.stderr

    data = json.loads(bundle.read_text())
    record = data["jobs"][5]["record"]
    result = json.loads(record["result"])
    record["result"] = json.dumps({**result, "result": 43})
    tampered = tmp_path / "tampered.json"
    tampered.write_text(json.dumps(data))
    refused = cli(two.settings, "audit", "--verify-file", str(tampered), "--keys", str(pinned), **nowhere)
    assert refused.returncode == 1 and f"{BATCH_SIZE - 1} verified, 1 mismatched" in refused.stdout
    assert "field 'result' differs" in refused.stdout

    strangers = tmp_path / "strangers.json"
    strangers.write_text(json.dumps({**json.loads(pinned.read_text()), "keys": []}))
    unknown = cli(two.settings, "audit", "--verify-file", str(bundle), "--keys", str(strangers), **nowhere)
    assert unknown.returncode == 1 and "not in the key set" in unknown.stdout
    assert cli(two.settings, "audit", "--verify-file", str(pinned), **nowhere).returncode == 2  # not a bundle


def test_a_running_worker_rotates_its_key(fleet_worker: WorkerFactory, tmp_path: Path) -> None:
    worker = fleet_worker("w", concurrency=2, sandboxes=1, worker_name=f"rotating-{free_port()}")
    settings = worker.settings
    model = write_script(worker.scripts_dir, 0.0)
    name = worker.worker.name  # name@host, as the worker signs
    env = {"SANDFLEET_WORKER_STATE_DIR": str(worker.folder / "worker-state")}
    client = worker.client
    try:

        def run_job() -> str:
            job = client.submit({"question": "six times seven", "model": model})
            assert job.result(timeout=JOB_TIMEOUT_S).result == 42
            return job.job_id

        def key_of(job_id: str) -> set[str]:
            return set(client.get(job_id).verify().signers)

        first = run_job()
        pinned_before = tmp_path / "keys-before.json"
        cli(settings, "keys", "export", "--out", str(pinned_before))
        rotated = cli(settings, "keys", "rotate", name, **env)
        assert rotated.returncode == 0, rotated.stderr
        (k1, k1_status), (k2, _active) = (line.split()[:2] for line in rotated.stdout.splitlines())
        assert k1_status == "retired" and key_of(first) == {k1}
        second = run_job()
        assert key_of(second) == {k2}, "the running worker signs with the new key at once"
        assert client.get(first).verify().verified and client.get(second).verify().verified
        listed = {
            json.loads(line)["key_id"]: json.loads(line)["status"]
            for line in cli(settings, "keys", "list", "--json").stdout.splitlines()
        }
        assert listed == {k1: "retired", k2: "active"}
        stale = cli(settings, "audit", "--verify", second, "--keys", str(pinned_before))
        assert stale.returncode == 1 and "not in the key set" in stale.stderr  # re-export after a rotation

        revoked = cli(settings, "keys", "rotate", name, "--revoke", **env)
        assert revoked.returncode == 0 and revoked.stdout.split()[:2] == [k2, "revoked"], revoked.stdout
        third = run_job()
        assert client.get(first).verify().verified and client.get(third).verify().verified
        verdict = client.get(second).verify()
        assert not verdict.verified and "which is revoked" in verdict.problems[0]
        with pytest.raises(UnverifiedResultError):
            client.get(second).result(timeout=1)

        [k3] = key_of(third)
        assert cli(settings, "keys", "revoke", k3).returncode == 0
    finally:
        stop_worker(worker)
    restart = subprocess.run(
        [SANDFLEET, "worker", "--hostname", name],
        env=worker.fleet.worker_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert restart.returncode != 0 and "refusing to start" in restart.stderr and "revoked" in restart.stderr


def test_the_replay_command_and_the_python_api_default_to_the_same_concurrency(docker_engine: object) -> None:
    from sandfleet.worker.cli import replay as command
    from sandfleet.worker.rerun.batch import DEFAULT_REPLAY_CONCURRENCY

    assert command.DEFAULT_REPLAY_CONCURRENCY == DEFAULT_REPLAY_CONCURRENCY
