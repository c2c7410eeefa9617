"""Noticing dead workers and handing their jobs back, in seconds rather than the broker's hour.

Celery's Redis transport keeps a delivered, unacknowledged message in kombu's ``unacked`` hash and
gives it back only after the whole visibility timeout. So each worker:

- beats: refreshes ``{p}:worker:{name}:heartbeat`` (TTL ``HEARTBEAT_TTL_S``) every
  ``HEARTBEAT_INTERVAL_S``, and records every message it receives (delivery tag -> job id) in
  ``{p}:worker:{name}:held`` until it acknowledges it;
- sweeps (one worker at a time, under a short lock): a worker whose heartbeat expired is dead; each
  message it held goes back on the queue through kombu's own ``restore_by_tag`` (which also removes
  it from ``unacked``, so it is not restored a second time an hour later). Unacknowledged messages
  of this fleet's queue that no live worker holds (a worker killed between receiving a message and
  recording it) go back too, once sweeps have seen them so for ``ORPHAN_AFTER_S`` by Redis's own
  clock (``orphan_suspects``). Not by kombu's delivery time: that is the delivering host's clock, and
  a host 30 s behind would make a message it received a moment ago look 30 s old.

The job itself is idempotent by id: a redelivered job records a new delivery and ends with exactly
one final record (sandfleet/core/store.py). Containers of the dead worker are removed by the local reaper
(their owner process is gone).
"""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import redis

from sandfleet.core.contracts import JobStatus
from sandfleet.core.priority import priority_lists, queue_length
from sandfleet.core.redis_keys import HEARTBEAT_TTL_S, FleetKeys
from sandfleet.core.replies import text, text_list

log = logging.getLogger("sandfleet.recovery")
_PROCESS_STARTED = time.monotonic()  # this module is imported when the worker process starts

HEARTBEAT_INTERVAL_S = 2.0
SWEEP_INTERVAL_S = 5.0
ORPHAN_AFTER_S = 30.0
RECOVERY_LOCK_MS = 15_000
RECOVERED_STREAM_MAXLEN = 10_000
KOMBU_UNACKED = "unacked"
KOMBU_UNACKED_INDEX = "unacked_index"
SCAN_CHUNK = 1000
RECONCILE_INTERVAL_S = 300.0
LOST_AFTER_S = 10.0


@dataclass
class SweepReport:
    dead_workers: list[str] = field(default_factory=list)
    restored: list[tuple[str, str]] = field(default_factory=list)  # (delivery tag, job id)
    orphans: list[str] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)  # dead workers' jobs whose message is gone
    lost: list[str] = field(default_factory=list)  # unfinished jobs whose message is nowhere on the broker
    ran: bool = False  # False when another process held the recovery lock


class WorkerPresence:
    """One worker's heartbeat, its record of held messages, and the periodic recovery sweep."""

    def __init__(
        self,
        client: redis.Redis,
        keys: FleetKeys,
        name: str,
        app: Any,
        queue: str,
        *,
        owner_label: str = "",
        on_sweep: Any = None,
        republish: Callable[[str], bool] | None = None,
        broker: redis.Redis | None = None,
        mcp_report: Callable[[], dict[str, str] | None] | None = None,
    ) -> None:
        self._redis = client  # the fleet's keys: heartbeats, held messages, records
        self._broker = (
            broker or client
        )  # kombu's keys: queues, unacked (apart with SANDFLEET_RESULTS_REDIS_URL)
        self._keys = keys
        self.name = name
        self._app = app
        self._queue = queue
        self._owner_label = owner_label
        self._on_sweep = on_sweep
        self._republish = republish
        self._mcp_report = mcp_report  # the MCP servers' states, published with each beat
        self._redis_run_id: str | None = None
        self._last_reconcile = time.monotonic()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="sandfleet-presence", daemon=True)

    def start(self) -> None:
        self.adopt_predecessor()
        self.beat()
        self._thread.start()

    def adopt_predecessor(self) -> None:
        """Hand back what a previous process of the same worker name held when it died.

        A worker restarted under its old name beats before its predecessor's heartbeat lapses, so the
        sweep would never see the predecessor dead. Messages delivered before this process started
        cannot be this process's own.
        """
        started = time.time() - time.monotonic() + _PROCESS_STARTED
        key = self._keys.worker_held(self.name)
        for raw_tag, raw_job in self._redis.hgetall(key).items():
            tag = text(raw_tag)
            delivered = self._broker.zscore(KOMBU_UNACKED_INDEX, tag)
            if delivered is None or delivered < started:
                restored = _restore(self._app, self._broker, tag)
                self._redis.hdel(key, tag)
                if restored:
                    log.warning("job %s held by this worker's previous process: handed back", text(raw_job))

    def beat(self) -> None:
        pipe = self._redis.pipeline()
        pipe.set(self._keys.heartbeat(self.name), json.dumps({"at": time.time()}), ex=HEARTBEAT_TTL_S)
        pipe.sadd(self._keys.workers, self.name)
        pipe.hset(
            self._keys.worker_info(self.name),
            mapping={
                "host": socket.gethostname(),
                "pid": os.getpid(),
                "owner": self._owner_label,
            },
        )
        self._report_mcp(pipe)
        pipe.execute()

    def _report_mcp(self, pipe: Any) -> None:
        """Rewrite ``{p}:worker:{name}:mcp`` in the beat's transaction (nothing before the MCP
        servers started); a report that cannot be made never stops the heartbeat."""
        if self._mcp_report is None:
            return
        try:
            report = self._mcp_report()
        except Exception as e:
            log.warning("could not report the MCP servers' states: %s", e)
            return
        if report is None:
            return
        key = self._keys.worker_mcp(self.name)
        pipe.delete(key)
        if report:
            pipe.hset(key, mapping=report)
            pipe.expire(key, HEARTBEAT_TTL_S)

    def holds(self, worker: str, job_id: str) -> bool:
        """Whether ``worker`` is alive and holds a message of ``job_id``."""
        pipe = self._redis.pipeline()
        pipe.exists(self._keys.heartbeat(worker))
        pipe.hvals(self._keys.worker_held(worker))
        alive, held = pipe.execute()
        return bool(alive) and job_id in {text(v) for v in held}

    def hold(self, delivery_tag: str, job_id: str) -> None:
        self._redis.hset(self._keys.worker_held(self.name), delivery_tag, job_id)

    def release(self, delivery_tag: str) -> None:
        self._redis.hdel(self._keys.worker_held(self.name), delivery_tag)

    def stop(self, *, clean: bool = True) -> None:
        """Stop beating; on a clean exit, say so (held messages were given back by kombu)."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5)
        if clean:
            try:
                pipe = self._redis.pipeline()
                pipe.delete(
                    self._keys.heartbeat(self.name),
                    self._keys.worker_held(self.name),
                    self._keys.worker_info(self.name),
                    self._keys.worker_mcp(self.name),
                )
                pipe.srem(self._keys.workers, self.name)
                pipe.execute()
            except redis.RedisError as e:
                log.warning("could not withdraw worker %s: %s", self.name, e)

    def forget_acknowledged(self) -> None:
        """Drop held entries kombu no longer has as unacknowledged (acknowledged or given back).

        Safe against races: kombu records a delivery in ``unacked`` before the worker sees it.
        """
        key = self._keys.worker_held(self.name)
        tags = [text(t) for t in self._redis.hkeys(key)]
        if not tags:
            return
        pipe = self._redis.pipeline()
        for tag in tags:
            pipe.hexists(KOMBU_UNACKED, tag)
        gone = [tag for tag, present in zip(tags, pipe.execute(), strict=True) if not present]
        if gone:
            self._redis.hdel(key, *gone)

    def _loop(self) -> None:
        next_sweep = time.monotonic() + SWEEP_INTERVAL_S
        while not self._stop.wait(HEARTBEAT_INTERVAL_S):
            try:
                self.beat()
                self.forget_acknowledged()
                if time.monotonic() >= next_sweep:
                    next_sweep = time.monotonic() + SWEEP_INTERVAL_S
                    reconcile = self._republish is not None and self._reconcile_due()
                    report = sweep(
                        self._redis,
                        self._keys,
                        self._app,
                        self._queue,
                        me=self.name,
                        reconcile=reconcile,
                        broker=self._broker,
                    )
                    if report.ran and reconcile:
                        self._last_reconcile = time.monotonic()
                    self._republish_lost(report)
                    if self._on_sweep is not None:
                        self._on_sweep(report)
            except redis.RedisError as e:
                log.warning("heartbeat or sweep failed (Redis): %s", e)
            except Exception:
                log.exception("recovery sweep failed")

    def _reconcile_due(self) -> bool:
        """Look for lost messages after a Redis restart, when the counts disagree, or now and then."""
        run_id = self._broker.info("server").get("run_id")
        restarted = self._redis_run_id is not None and run_id != self._redis_run_id
        self._redis_run_id = run_id
        if restarted or time.monotonic() - self._last_reconcile >= RECONCILE_INTERVAL_S:
            return True
        messages = queue_length(self._broker, self._queue) + self._broker.hlen(KOMBU_UNACKED)
        unfinished = self._redis.zcard(self._keys.status_index(JobStatus.QUEUED)) + self._redis.zcard(
            self._keys.status_index(JobStatus.RUNNING)
        )
        return unfinished > messages

    def _republish_lost(self, report: SweepReport) -> None:
        for job_id in dict.fromkeys(report.missing + report.lost):
            try:
                republished = self._republish is not None and self._republish(job_id)
            except Exception as e:  # the record may be gone (expired): nothing to hand back
                log.warning("could not republish job %s: %s", job_id, e)
                continue
            if republished:
                self._redis.xadd(
                    self._keys.recovered,
                    {"job_id": job_id, "reason": "message lost", "at": str(time.time())},
                    maxlen=RECOVERED_STREAM_MAXLEN,
                    approximate=True,
                )
                log.warning("job %s had no message on the broker: published again", job_id)


def sweep(
    client: redis.Redis,
    keys: FleetKeys,
    app: Any,
    queue: str,
    *,
    me: str = "",
    orphan_after_s: float = ORPHAN_AFTER_S,
    reconcile: bool = False,
    broker: redis.Redis | None = None,
) -> SweepReport:
    """Give back the messages of dead workers and orphaned ones; with ``reconcile``, also list queued
    unfinished jobs whose message is lost (``report.lost``). Safe to call from any process.
    ``broker`` holds kombu's keys when the records live apart (default: ``client``)."""
    broker = broker or client
    report = SweepReport()
    token = f"{socket.gethostname()}:{os.getpid()}:{time.monotonic()}"
    if not client.set(keys.recovery_lock, token, nx=True, px=RECOVERY_LOCK_MS):
        return report
    report.ran = True
    try:
        if reconcile:
            report.lost = lost_jobs(client, keys, queue, min_age_s=LOST_AFTER_S, broker=broker)
        live_tags: set[str] = set()
        for raw in client.smembers(keys.workers):
            name = raw.decode() if isinstance(raw, bytes) else raw
            held = {text(k): text(v) for k, v in client.hgetall(keys.worker_held(name)).items()}
            if name == me or client.exists(keys.heartbeat(name)):
                live_tags.update(held)
                continue
            report.dead_workers.append(name)
            for tag, job_id in held.items():
                if _restore(app, broker, tag):
                    report.restored.append((tag, job_id))
                else:  # acknowledged meanwhile, or lost with a Redis restart: reconcile decides
                    report.missing.append(job_id)
                    continue
                client.xadd(
                    keys.recovered,
                    {"worker": name, "job_id": job_id, "tag": tag, "at": str(time.time())},
                    maxlen=RECOVERED_STREAM_MAXLEN,
                    approximate=True,
                )
            pipe = client.pipeline()
            pipe.delete(keys.worker_held(name), keys.worker_info(name), keys.worker_mcp(name))
            pipe.srem(keys.workers, name)
            pipe.execute()
            log.warning("worker %s stopped beating; %d job(s) handed back", name, len(held))
        unheld = set(text_list(broker.zrange(KOMBU_UNACKED_INDEX, 0, -1))) - live_tags
        for tag in _orphans_due(client, keys, unheld - {t for t, _ in report.restored}, orphan_after_s):
            message = broker.hget(KOMBU_UNACKED, tag)
            if message is None or _routing_key(text(message)) != queue:
                continue
            if _restore(app, broker, tag):
                report.orphans.append(tag)
            log.warning("unacknowledged message %s held by no live worker: handed back", tag)
    finally:
        if text(client.get(keys.recovery_lock) or b"") == token:
            client.delete(keys.recovery_lock)
    return report


def _orphans_due(client: redis.Redis, keys: FleetKeys, unheld: set[str], after_s: float) -> list[str]:
    """The tags of ``unheld`` that sweeps have seen unheld for ``after_s`` (Redis's clock: the same for
    every host); the others are remembered from now, and tags no longer unheld (handed back,
    acknowledged, or held after all) forgotten."""
    seconds, micros = client.time()
    now = seconds + micros / 1e6
    seen: dict[str, float] = {}
    for raw_tag, raw_when in client.hgetall(keys.orphan_suspects).items():
        try:
            seen[text(raw_tag)] = float(text(raw_when))
        except ValueError:  # not ours (whoever can write Redis): counted from now, written again
            pass
    due = sorted(tag for tag in unheld if now - seen.get(tag, now) >= after_s)
    pipe = client.pipeline()
    if gone := [tag for tag in seen if tag not in unheld]:
        pipe.hdel(keys.orphan_suspects, *gone)
    new: dict[Any, str] = {tag: repr(now) for tag in unheld if tag not in seen and tag not in due}
    if new:
        pipe.hset(keys.orphan_suspects, mapping=new)
    pipe.execute()
    return due


def message_job_ids(client: redis.Redis, queue: str) -> set[str]:
    """Job ids of every message of ``queue`` on the broker: waiting in the queue or unacknowledged."""
    ids: set[str] = set()
    for key in priority_lists(queue):
        length = client.llen(key)
        for start in range(0, length, SCAN_CHUNK):
            for raw in client.lrange(key, start, start + SCAN_CHUNK - 1):
                ids.add(_message_id(raw))
    for _tag, raw in client.hscan_iter(KOMBU_UNACKED, count=SCAN_CHUNK):
        try:
            message, _exchange, routing_key = json.loads(raw)
        except (ValueError, TypeError):
            continue
        if routing_key == queue:
            ids.add(_message_id(message))
    ids.discard("")
    return ids


def lost_jobs(
    client: redis.Redis, keys: FleetKeys, queue: str, *, min_age_s: float, broker: redis.Redis | None = None
) -> list[str]:
    """Jobs queued or running for more than ``min_age_s`` whose message is nowhere on the broker.

    With late acknowledgement an unfinished job's message is always in the queue or in kombu's
    ``unacked``. It is lost when Redis restarts between a worker's pop and its bookkeeping (kombu
    moves a message from the queue to ``unacked`` in two steps), when a task's retry could not be
    published while Redis was down, or when a producer dies between recording a job and publishing
    it. The job id keeps a republished job idempotent if the old message shows up after all.

    Ages by Redis's clock (``TIME``), the one clock every host shares: a sweeping host whose own
    clock ran 30 s ahead took every job a producer had just recorded, and was still publishing, for
    10 s old and lost, and published it a second time (tests/reliability/test_lost_jobs_clock.py).
    """
    seconds, micros = client.time()
    cutoff = seconds + micros / 1e6 - min_age_s
    candidates = [
        *client.zrangebyscore(keys.status_index(JobStatus.QUEUED), 0, cutoff),
        *client.zrangebyscore(keys.status_index(JobStatus.RUNNING), 0, cutoff),
    ]
    if not candidates:
        return []
    present = message_job_ids(broker or client, queue)
    return [job_id for job_id in map(text, candidates) if job_id not in present]


def _message_id(raw: Any) -> str:
    try:
        message = json.loads(raw) if isinstance(raw, bytes | str) else raw
        return str(message["headers"]["id"])
    except (ValueError, TypeError, KeyError):
        return ""


def _restore(app: Any, client: redis.Redis, tag: str) -> bool:
    """Put one unacknowledged message back on its queue with kombu's own code; False if it is gone."""
    if not client.hexists(KOMBU_UNACKED, tag):
        return False
    with app.connection_for_write() as conn:
        conn.default_channel.qos.restore_by_tag(tag)
    return True


def _routing_key(raw: bytes | str) -> str | None:
    try:
        _message, _exchange, routing_key = json.loads(raw)
        return routing_key
    except (ValueError, TypeError):
        return None
