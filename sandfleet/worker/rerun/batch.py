"""Replaying many finished jobs in one process: one warm sandbox pool, replays run concurrently.

One ``sandfleet replay JOB`` process per job pays an interpreter start, imports, a Redis connection
and a cold container each time (~0.6 s a job, measured in issue 18); here a batch pays them once and
its replays take warm containers (benchmarks/replay_batch.py has the figures).

    report = replay_batch(settings, "batch-1234", concurrency=4)
    print(report.summary()); raise SystemExit(report.exit_status())
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass

from sandfleet.core.config import SandboxConfig
from sandfleet.core.contracts import JobStatus
from sandfleet.core.errors import SandfleetError
from sandfleet.core.key_registry import KeyRegistry, verification_ring
from sandfleet.core.records import JobRecord, RecordReader
from sandfleet.core.redis_keys import FleetKeys
from sandfleet.core.settings import Settings
from sandfleet.core.signing import KeyRing
from sandfleet.core.verify import JobEvidence, Verdict, VerdictState, verify_job
from sandfleet.worker.rerun.job import ReplayOutcome, ReplayState, replay_job
from sandfleet.worker.sandbox.policy import replay_sandbox
from sandfleet.worker.sandbox.pool import SandboxPool

log = logging.getLogger(__name__)

DEFAULT_REPLAY_CONCURRENCY = 4  # replays at once; on 2 cores more only queue on dockerd


@dataclass(frozen=True)
class ReplayReport:
    """Outcomes in the order the jobs were given, and the wall time of the whole replay."""

    outcomes: list[ReplayOutcome]
    seconds: float

    def count(self, state: ReplayState) -> int:
        return sum(o.state == state for o in self.outcomes)

    def summary(self) -> str:
        counts = ", ".join(f"{self.count(s)} {s.value}" for s in ReplayState)
        rate = f", {len(self.outcomes) / self.seconds:.1f} jobs/s" if self.seconds > 0 else ""
        return f"{len(self.outcomes)} jobs: {counts} ({self.seconds:.1f} s{rate})"

    def exit_status(self) -> int:
        """0 every replayable job matched; 1 a difference, an unverified record, a replay refused by
        the local policy or a failed one; 3 some jobs have not ended (or have no record)."""
        failing = (ReplayState.DIFFERENT, ReplayState.UNVERIFIED, ReplayState.FAILED, ReplayState.REFUSED)
        if any(self.count(s) for s in failing):
            return 1
        return 3 if self.count(ReplayState.MISSING) else 0


@contextmanager
def replay_pool(concurrency: int, *, warm: bool = True) -> Iterator[SandboxPool]:
    """A pool that keeps ``concurrency`` containers warm (``warm``) and lets as many more start; one
    replay alone gets a single cold container (warming one would only start a second)."""
    if not warm:
        with SandboxPool(pool_size=0, max_live=concurrency) as pool:
            yield pool
        return
    with SandboxPool(pool_size=concurrency, max_live=2 * concurrency) as pool:
        yield pool


def warm_default(pool: SandboxPool, settings: Settings) -> None:
    """Start warming the sandbox a job with the default options replays in (most jobs), before the
    records are read: its containers start while the batch is read and verified. Nothing is warmed
    when the local policy refuses even that (each replay is then refused, named); unused containers
    are removed with the pool."""
    try:
        pool.warm(replay_sandbox({}, settings))
    except ValueError:
        pass


def replay_many(
    evidences: list[JobEvidence],
    ring: KeyRing,
    pool: SandboxPool,
    settings: Settings,
    concurrency: int = DEFAULT_REPLAY_CONCURRENCY,
) -> ReplayReport:
    """Replay every job, ``concurrency`` at once, on ``pool``'s warm containers, under the policy of
    ``settings`` (this machine's; warming too: no container of a refused config starts).

    Every chain is verified first, in one pass, before any replay takes a container: only the configs
    of verified jobs with a program to re-run are warmed, and each replay gets its job's verdict (the
    checks are those of ``replay_job``, unchanged; each chain is checked once).
    """
    began = time.perf_counter()
    verdicts = [verify_job(evidence, ring) for evidence in evidences]
    if pool.pool_size:
        for config in _configs(evidences, verdicts, settings):
            pool.warm(config)

    def one(item: tuple[JobEvidence, Verdict]) -> ReplayOutcome:
        evidence, verdict = item
        try:
            return replay_job(evidence, ring, pool, settings, verdict)
        except SandfleetError as e:  # the replay could not run; say so, and go on with the others
            log.warning("replay of job %s could not run: %s", evidence.job_id, e)
            return ReplayOutcome(
                evidence.job_id, ReplayState.FAILED, verdict, reason=f"the replay could not run: {e}"
            )

    with ThreadPoolExecutor(max_workers=concurrency, thread_name_prefix="sandfleet-replay") as executor:
        outcomes = list(executor.map(one, zip(evidences, verdicts, strict=True)))
    return ReplayReport(outcomes, time.perf_counter() - began)


def replay_batch(
    settings: Settings,
    batch_id: str,
    *,
    concurrency: int = DEFAULT_REPLAY_CONCURRENCY,
    ring: KeyRing | None = None,
) -> ReplayReport:
    """Replay every job of a batch in this process (the Python side of ``sandfleet replay --batch``).

    Raises:
        JobNotFoundError: no such batch.
        redis.RedisError: the records cannot be read.
    """
    from sandfleet.core.errors import JobNotFoundError

    with RecordReader.connect(settings.results_redis_url or settings.redis_url, settings) as reader:
        job_ids = reader.batch_job_ids(batch_id)
        if not job_ids:
            raise JobNotFoundError(f"no batch {batch_id!r} (never submitted, or past retention)")
        evidences = reader.evidence_many(job_ids)
        if ring is None:
            ring = verification_ring(settings, KeyRegistry(reader.redis, FleetKeys(settings.key_prefix)))
    with replay_pool(concurrency) as pool:
        return replay_many(evidences, ring, pool, settings, concurrency)


def _configs(
    evidences: list[JobEvidence], verdicts: list[Verdict], settings: Settings
) -> list[SandboxConfig]:
    """The distinct sandbox configs the replays will get (replay_sandbox), to warm before they start:
    those of verified jobs that succeeded with a program. A config the local policy refuses is not
    warmed (its replay is refused, named), nor one of a record its chain does not prove."""
    configs: dict[str, SandboxConfig] = {}
    for evidence, verdict in zip(evidences, verdicts, strict=True):
        if verdict.state != VerdictState.VERIFIED:
            continue
        try:
            record = JobRecord.from_hash(evidence.record)
            spec, result = record.spec, record.result
            if (
                spec is None
                or result is None
                or result.status != JobStatus.SUCCEEDED
                or not result.final_program
            ):
                continue
            config = replay_sandbox(spec.sandbox, settings)
        except ValueError:  # a record too damaged to read, or refused: its outcome will say so
            continue
        configs.setdefault(config.fingerprint(), config)
    return list(configs.values())
