"""Noticing dead workers and handing their jobs back, in seconds rather than the broker's hour.

Celery's Redis transport keeps a delivered, unacknowledged message in kombu's ``unacked`` hash and
gives it back only after the whole visibility timeout. So each worker:

- beats: refreshes ``{p}:worker:{name}:heartbeat`` (TTL ``HEARTBEAT_TTL_S``) every
  ``HEARTBEAT_INTERVAL_S``, and records every message it receives (delivery tag -> job id) in
  ``{p}:worker:{name}:held`` until it acknowledges it;
- sweeps (one worker at a time, under a short lock): a worker whose heartbeat expired is dead; each
  message it held goes back on the queue through kombu's own ``restore_by_tag`` (which also removes
  it from ``unacked``, so it is not restored a second time an hour later). Unacknowledged messages
  of this fleet's queue that no live worker holds and that are older than ``ORPHAN_AFTER_S`` (a
  worker killed between receiving a message and recording it) go back too.

The job itself is idempotent by id: a redelivered job records a new delivery and ends with exactly
one final record (worker/store). Containers of the dead worker are removed by the local reaper
(their owner process is gone).
"""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import redis

from producer.keys import FleetKeys

log = logging.getLogger("sandfleet.recovery")

HEARTBEAT_INTERVAL_S = 2.0
HEARTBEAT_TTL_S = 10
SWEEP_INTERVAL_S = 5.0
ORPHAN_AFTER_S = 30.0
RECOVERY_LOCK_MS = 15_000
RECOVERED_STREAM_MAXLEN = 10_000
KOMBU_UNACKED = "unacked"
KOMBU_UNACKED_INDEX = "unacked_index"


@dataclass
class SweepReport:
    dead_workers: list[str] = field(default_factory=list)
    restored: list[tuple[str, str]] = field(default_factory=list)  # (delivery tag, job id)
    orphans: list[str] = field(default_factory=list)


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
    ) -> None:
        self._redis = client
        self._keys = keys
        self.name = name
        self._app = app
        self._queue = queue
        self._owner_label = owner_label
        self._on_sweep = on_sweep
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="sandfleet-presence", daemon=True)

    def start(self) -> None:
        self.beat()
        self._thread.start()

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
        pipe.execute()

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
        tags = [_text(t) for t in self._redis.hkeys(key)]
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
                    report = sweep(self._redis, self._keys, self._app, self._queue, me=self.name)
                    if self._on_sweep is not None:
                        self._on_sweep(report)
            except redis.RedisError as e:
                log.warning("heartbeat or sweep failed (Redis): %s", e)
            except Exception:
                log.exception("recovery sweep failed")


def sweep(
    client: redis.Redis,
    keys: FleetKeys,
    app: Any,
    queue: str,
    *,
    me: str = "",
    orphan_after_s: float = ORPHAN_AFTER_S,
) -> SweepReport:
    """Give back the messages of dead workers and orphaned ones. Safe to call from any process."""
    report = SweepReport()
    token = f"{socket.gethostname()}:{os.getpid()}:{time.monotonic()}"
    if not client.set(keys.recovery_lock, token, nx=True, px=RECOVERY_LOCK_MS):
        return report
    try:
        live_tags: set[str] = set()
        for raw in client.smembers(keys.workers):
            name = raw.decode() if isinstance(raw, bytes) else raw
            held = {_text(k): _text(v) for k, v in client.hgetall(keys.worker_held(name)).items()}
            if name == me or client.exists(keys.heartbeat(name)):
                live_tags.update(held)
                continue
            report.dead_workers.append(name)
            for tag, job_id in held.items():
                _restore(app, tag)
                report.restored.append((tag, job_id))
                client.xadd(
                    keys.recovered,
                    {"worker": name, "job_id": job_id, "tag": tag, "at": str(time.time())},
                    maxlen=RECOVERED_STREAM_MAXLEN,
                    approximate=True,
                )
            pipe = client.pipeline()
            pipe.delete(keys.worker_held(name), keys.worker_info(name))
            pipe.srem(keys.workers, name)
            pipe.execute()
            log.warning("worker %s stopped beating; %d job(s) handed back", name, len(held))
        ceiling = time.time() - orphan_after_s
        for raw_tag in client.zrangebyscore(KOMBU_UNACKED_INDEX, 0, ceiling):
            tag = _text(raw_tag)
            if tag in live_tags or tag in {t for t, _ in report.restored}:
                continue
            raw = client.hget(KOMBU_UNACKED, tag)
            if raw is None or _routing_key(raw) != queue:
                continue
            _restore(app, tag)
            report.orphans.append(tag)
            log.warning("unacknowledged message %s held by no live worker: handed back", tag)
    finally:
        if _text(client.get(keys.recovery_lock) or b"") == token:
            client.delete(keys.recovery_lock)
    return report


def _restore(app: Any, tag: str) -> None:
    """Put one unacknowledged message back on its queue with kombu's own code."""
    with app.connection_for_write() as conn:
        conn.default_channel.qos.restore_by_tag(tag)


def _routing_key(raw: bytes | str) -> str | None:
    try:
        _message, _exchange, routing_key = json.loads(raw)
        return routing_key
    except (ValueError, TypeError):
        return None


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value
