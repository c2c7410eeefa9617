"""Completion webhooks: a signed POST when a job (``JobSpec.webhook``) or its whole batch
(``JobSpec.batch_webhook``) ends. Signing: sandfleet/core/webhook_signing.py.

The POST never delays the job's final record, and the chain proves what was sent. The first two
steps run from a job-end hook of the worker's ``JobEnd``, the one path by which jobs end:
``WebhookHook`` (sandfleet/worker/delivery/reporting.py); the third from the worker's recovery loop.

1. :meth:`Webhooks.before_seal`, just before the final record is written: the body is built from the
   result about to be written, and a ``webhook`` audit event commits to it (URL, event, the body's
   SHA-256, the signing timestamp) in the job's chain, which the seal then closes. When this job is
   the last of its batch still running (every other job of the batch has ended), the batch's POST is
   committed in the same chain. Each committed POST is also kept in the fleet's webhook outbox
   (sandfleet/core/webhook_outbox.py) until it is delivered.
2. :meth:`Webhooks.job_ended`, after the final record: the committed POSTs are handed to the
   :class:`~sandfleet.worker.webhooks.sender.WebhookSender` (background threads, retries with
   backoff) and the outcome lands in the job's record (``webhook_status``, ``webhook_tries``,
   ``webhook_error``) or the batch's webhook hash. A batch's POST is sent once (claimed with SETNX).
3. :meth:`Webhooks.sweep`, on every live worker after each recovery sweep: an outbox entry whose
   worker stopped beating, or that is past its retry schedule, is sent by whichever worker claims it
   (sandfleet/worker/webhooks/sweep.py), once the job's verified chain shows that its sealing worker
   committed exactly that POST (sandfleet/worker/webhooks/committed.py).

Delivery is at least once: every try, the first and the outbox's included, carries the same body,
timestamp, signature and ``Idempotency-Key`` (``job.ended:JOB``, ``batch.ended:batch:ID``), so a
receiver drops duplicates by it. A worker killed between the seal and a successful POST loses
nothing: another worker sends it about 10-15 s later (its heartbeat lapses, the next sweep runs).
"""

from sandfleet.worker.webhooks.hooks import Webhooks

__all__ = ["Webhooks"]
