"""Every Redis key the fleet uses, in one place (arq's ``constants.py`` habit).

All keys live under ``Settings.key_prefix`` (``sandfleet`` by default), so one Redis can hold several
fleets and ``SCAN MATCH sandfleet:*`` finds everything a fleet wrote. Producers and workers build
keys only through :class:`FleetKeys`; nothing else spells a key.

Per job (each one expires ``Settings.retention_s`` after the job's last write):

``{p}:job:{id}``                  hash, the job record: ``job_id``, ``status``, ``spec`` (JobSpec JSON),
                                  ``batch_id`` and ``batch_creator`` (the digest of its batch's
                                  creator), ``{status}_at`` per transition (epoch seconds),
                                  ``updated_at``, ``attempts`` (runs started), ``deliveries`` (messages
                                  received), ``worker``, ``result`` (JobResult JSON, once final),
                                  ``audit_head`` and ``audit_count`` (the audit chain's tip),
                                  ``model_s`` and ``model_tokens`` (model time and tokens over every
                                  delivery: the ledger of the job's model budgets).
``{p}:job:{id}:audit``            stream, the audit log: one entry per event, fields ``event``
                                  (AuditEvent JSON), ``hash`` (SHA-256 chained to the previous entry),
                                  ``sig`` and ``key`` (the writing worker's Ed25519 signature and key
                                  id; empty on the producer's entry 0). See sandfleet/core/chain.py.
``{p}:job:{id}:deliveries``       hash, deliveries per Celery retry number (``"0"``, ``"1"`` ...): a
                                  message redelivered after its worker died counts up, a retry starts
                                  a new count, so only crash loops reach ``Settings.max_deliveries``.
``{p}:job:{id}:final``            string, the final-record guard: set once, by the delivery that wrote
                                  the final record; its presence refuses every later transition.
``{p}:job:{id}:done``             list, one element pushed when the job ends, so waiters ``BLPOP``
                                  instead of polling.
``{p}:job:{id}:artifact:{sha256}`` string, the bytes of one artifact (a file the program wrote under
                                  /workspace/out/), by its SHA-256; written by the worker before the
                                  final record, with the same retention (sandfleet/core/artifacts.py).
``{p}:job:{id}:cancel``           string, the job's cancel request (JSON: ``requested_at``, ``by``);
                                  a worker that sees it never starts the job, or stops it
                                  (sandfleet/core/cancel.py). Only once requested; it expires with
                                  the retention from the request.
``{p}:job:{id}:approvals``        hash, ``{attempt}:{call sha256}:{occurrence}`` -> approval request id:
                                  the requests of the job's gated calls (sandfleet/core/approvals.py).
``{p}:job:{id}:checkpoint``       string, the suspended job's engine state (JSON) while it awaits a
                                  decision; its digest is in the chain's ``awaiting_approval`` event.
                                  (These two exist only for jobs with gated calls, each written with
                                  the retention as its TTL; not in ``job_keys``.)
``{p}:job:{id}:webhooks``         hash, the job's webhook outbox: ``{event}/{body sha256}`` -> the
                                  committed POST not yet delivered (JSON: URL, event, delivery id,
                                  body, timestamp, committing worker, commit time), and
                                  ``{event}/{body sha256}:tries`` -> the outbox's tries
                                  (sandfleet/core/webhook_outbox.py). Written with the retention as
                                  its TTL when the POST is committed; not in ``job_keys``.

Per batch (expire like the jobs):

``{p}:batch:{id}:jobs``           list, the batch's job ids in submission order.
``{p}:batch:{id}:counts``         hash, status -> number of the batch's jobs in it (``total`` too):
                                  progress is one ``HGETALL``; and ``creator``, the digest of the
                                  submitter token that created the batch (sandfleet/core/batch_creator.py).
``{p}:batch:{id}:webhook``        hash, the batch's completion webhook: claimed once (``url``,
                                  ``worker``), then its outcome (``status``, ``tries``, ``error``).

Fleet-wide:

``{p}:jobs``                      sorted set, every job id scored by submission time (for listings);
                                  entries older than the retention are trimmed on write.
``{p}:jobs:{status}``             sorted set per status, job ids scored by when they entered it.
``{p}:rejected``                  stream (capped), messages the workers discarded: not JSON, unknown
                                  task, no job record.
``{p}:cancels``                   set, ids of jobs with a cancel request that have not ended yet:
                                  every worker sweeps it (a pub/sub message can be missed).
``{p}:cancel``                    pub/sub channel (not a key): a job id per cancel request, so the
                                  worker running it stops it at once.
``{p}:worker:{name}:heartbeat``   string with a TTL, refreshed by a live worker (sandfleet/worker/delivery/recovery.py).
``{p}:workers``                   set, names of workers that have announced themselves.
``{p}:worker:{name}:info``        hash, a worker's host, pid and sandbox owner label.
``{p}:worker:{name}:held``        hash, broker delivery tag -> job id of every message the worker
                                  has received and not yet acknowledged.
``{p}:worker:{name}:mcp``         hash with the heartbeat's TTL, MCP server name -> its state as the
                                  worker sees it (JSON: up, detail, tools, last ping ...), rewritten
                                  with each heartbeat; ``sandfleet doctor`` reads it
                                  (sandfleet/worker/mcp/status.py).
``{p}:recovery:lock``             string with a short TTL: one recovery sweep at a time.
``{p}:webhooks:outbox``           sorted set, ``{job id}/{event}/{body sha256}`` of every committed,
                                  undelivered webhook, scored by when a sweep looks at it next
                                  (epoch seconds); a worker claims one by moving its score (Lua).
``{p}:recovered``                 stream (capped), jobs handed back after their worker died.
``{p}:worker:{name}:tools``       hash, tool name -> signature line, the catalog a worker publishes.
``{p}:approval:{id}``             hash, one approval request: ``request`` (its JSON: job, question,
                                  program, tool, redacted arguments, call hash), ``status``,
                                  ``deadline``, ``decided_by``/``decided_at``/``reason``, ``outcome``.
``{p}:approvals``                 sorted set, every request id scored by when it was asked.
``{p}:approvals:pending``         sorted set, undecided request ids scored by their deadline.
``{p}:signing_keys``              hash, key id -> KeyInfo JSON (worker, Ed25519 public key, status):
                                  every worker's public keys, active, retired and revoked. Never
                                  expires: old chains stay checkable (sandfleet/core/key_registry.py).

The broker queue itself is a kombu list named after the prefix (``sandfleet``, see
:mod:`sandfleet.core.queue`); kombu's own bookkeeping (``unacked``, ``_kombu.*``) is not under the prefix. Keys are for one Redis (or a primary with replicas), not Redis Cluster: the Lua
scripts touch a job's keys and the fleet-wide indexes together.
"""

from __future__ import annotations

from dataclasses import dataclass

from sandfleet.core.vocabulary import ID_PATTERN, JobStatus

# Job and batch ids become part of key names: ID_PATTERN keeps them to a safe alphabet.
REJECTED_STREAM_MAXLEN = 10_000
HEARTBEAT_TTL_S = (
    10  # a live worker refreshes its heartbeat every 2 s (sandfleet/worker/delivery/recovery.py)
)


@dataclass(frozen=True)
class FleetKeys:
    """Key names under one prefix. ``FleetKeys("sandfleet").job("abc") == "sandfleet:job:abc"``."""

    prefix: str = "sandfleet"

    # -- per job ------------------------------------------------------------------------------
    def job(self, job_id: str) -> str:
        return f"{self.prefix}:job:{job_id}"

    def audit(self, job_id: str) -> str:
        return f"{self.job(job_id)}:audit"

    def deliveries(self, job_id: str) -> str:
        return f"{self.job(job_id)}:deliveries"

    def final_guard(self, job_id: str) -> str:
        return f"{self.job(job_id)}:final"

    def done(self, job_id: str) -> str:
        return f"{self.job(job_id)}:done"

    def artifact(self, job_id: str, sha256: str) -> str:
        return f"{self.job(job_id)}:artifact:{sha256}"

    def cancel(self, job_id: str) -> str:
        return f"{self.job(job_id)}:cancel"

    def job_approvals(self, job_id: str) -> str:
        return f"{self.job(job_id)}:approvals"

    def checkpoint(self, job_id: str) -> str:
        return f"{self.job(job_id)}:checkpoint"

    def job_webhooks(self, job_id: str) -> str:
        """Hash: the job's committed, undelivered webhooks (its outbox entries)."""
        return f"{self.job(job_id)}:webhooks"

    def job_keys(self, job_id: str) -> tuple[str, ...]:
        """Every key of one job (what retention expires and what cleanup deletes)."""
        return (
            self.job(job_id),
            self.audit(job_id),
            self.deliveries(job_id),
            self.final_guard(job_id),
            self.done(job_id),
        )

    # -- per batch ----------------------------------------------------------------------------
    def batch_jobs(self, batch_id: str) -> str:
        return f"{self.prefix}:batch:{batch_id}:jobs"

    def batch_counts(self, batch_id: str) -> str:
        return f"{self.prefix}:batch:{batch_id}:counts"

    def batch_webhook(self, batch_id: str) -> str:
        """Hash: the batch's completion webhook (set once, by the worker that sends it; its outcome)."""
        return f"{self.prefix}:batch:{batch_id}:webhook"

    # -- approvals ----------------------------------------------------------------------------
    def approval(self, request_id: str) -> str:
        return f"{self.prefix}:approval:{request_id}"

    @property
    def approvals(self) -> str:
        return f"{self.prefix}:approvals"

    @property
    def approvals_pending(self) -> str:
        return f"{self.prefix}:approvals:pending"

    # -- fleet-wide ---------------------------------------------------------------------------
    @property
    def all_jobs(self) -> str:
        return f"{self.prefix}:jobs"

    def status_index(self, status: JobStatus | str) -> str:
        return f"{self.prefix}:jobs:{JobStatus(status).value}"

    def status_indexes(self) -> tuple[str, ...]:
        """The per-status indexes, in ``JobStatus`` order (the Lua scripts rely on this order)."""
        return tuple(self.status_index(s) for s in JobStatus)

    @property
    def rejected(self) -> str:
        return f"{self.prefix}:rejected"

    @property
    def cancels(self) -> str:
        return f"{self.prefix}:cancels"

    @property
    def cancel_channel(self) -> str:
        return f"{self.prefix}:cancel"

    def heartbeat(self, worker: str) -> str:
        return f"{self.prefix}:worker:{worker}:heartbeat"

    @property
    def signing_keys(self) -> str:
        return f"{self.prefix}:signing_keys"

    # -- worker presence (see _fleet_worker_keys) ------------------------------------------------
    @property
    def workers(self) -> str:
        return f"{self.prefix}:workers"

    def worker_info(self, worker: str) -> str:
        return f"{self.prefix}:worker:{worker}:info"

    def worker_held(self, worker: str) -> str:
        return f"{self.prefix}:worker:{worker}:held"

    def worker_mcp(self, worker: str) -> str:
        return f"{self.prefix}:worker:{worker}:mcp"

    @property
    def recovery_lock(self) -> str:
        return f"{self.prefix}:recovery:lock"

    @property
    def orphan_suspects(self) -> str:
        """Hash: delivery tag -> when (Redis's clock) a sweep first saw it unacknowledged and unheld."""
        return f"{self.prefix}:recovery:orphan-suspects"

    @property
    def webhook_outbox(self) -> str:
        """Sorted set: every committed, undelivered webhook of the fleet, by when it is due."""
        return f"{self.prefix}:webhooks:outbox"

    @property
    def replication_probe(self) -> str:
        """A tiny write on the WAIT's own connection (WAIT counts only its connection's writes)."""
        return f"{self.prefix}:replication:probe"

    @property
    def recovered(self) -> str:
        return f"{self.prefix}:recovered"


def check_id(value: str, what: str = "job id") -> str:
    """``value`` if it is a safe id, else ValueError naming the accepted alphabet."""
    if not isinstance(value, str) or not ID_PATTERN.match(value):
        raise ValueError(f"{what} must be 1-128 of letters, digits and _.:-, got {value!r}")
    return value
