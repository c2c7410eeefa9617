"""Completion webhooks: a signed POST when a job (``JobSpec.webhook``) or its whole batch
(``JobSpec.batch_webhook``) ends. Signing: sandfleet/core/webhook_signing.py.

Two steps, so the POST never delays the job's final record and the chain proves what was sent:

Both run from a job-end hook of the worker's ``JobEnd``, the one path by which jobs end:
``WebhookHook`` (sandfleet/worker/delivery/reporting.py).

1. :meth:`Webhooks.before_seal`, just before the final record is written: the body is built from the
   result about to be written, and a ``webhook`` audit event commits to it (URL, event, the body's
   SHA-256, the signing timestamp) in the job's chain, which the seal then closes. When this job is
   the last of its batch still running (every other job of the batch has ended), the batch's POST is
   committed in the same chain.
2. :meth:`Webhooks.job_ended`, after the final record: the committed POSTs are handed to the
   :class:`~sandfleet.worker.webhooks.sender.WebhookSender` (background threads, retries with
   backoff) and the outcome lands in the job's record (``webhook_status``, ``webhook_tries``,
   ``webhook_error``) or the batch's webhook hash. A batch's POST is sent once (claimed with SETNX).

Delivery is at least once in practice (a receiver should drop repeats by ``X-Sandfleet-Delivery``);
a worker killed between the seal and a successful POST loses that POST, and the committed event
without a ``webhook_status`` in the record shows it.
"""

from sandfleet.worker.webhooks.hooks import Webhooks

__all__ = ["Webhooks"]
