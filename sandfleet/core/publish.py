"""Publishing job messages by task name: what the producer does on submit, and what a worker does
when the broker lost a job's message (a Redis restart) and the job must be published again.

Publishing never imports worker code: the message names the task (``sandfleet.run_job``) and
carries the spec as JSON. The job id is the task id and the idempotency key, so a message published
twice still ends the job exactly once.
"""

from __future__ import annotations

from typing import Any

from sandfleet.core.contracts import JobSpec
from sandfleet.core.priority import broker_priority, effective_priority
from sandfleet.core.queue import TASK_NAME, check_time_limits, queue_name
from sandfleet.core.records import RecordReader
from sandfleet.core.settings import Settings

QUESTION_SHOWN_CHARS = 60  # of the question, in the task's argsrepr (what Flower shows, after the mode)


class JobPublisher:
    """Sends one task message per job through ``app`` (a Celery app of :func:`make_app`)."""

    def __init__(self, app: Any, settings: Settings) -> None:
        self.app = app
        self.settings = settings

    def send(self, job_id: str, spec: JobSpec, producer: Any = None) -> None:
        """One task message: the job id as task id, the spec as JSON, the job's priority as the broker's
        (core/priority.py); Flower shows the question and mode, and the priority.

        Raises:
            InvalidSpecError: the job's time limits do not nest inside the visibility timeout.
        """
        soft, hard = check_time_limits(self.settings, spec)
        priority = effective_priority(spec.priority, spec.batch_id)
        self.app.send_task(
            TASK_NAME,
            args=[job_id, spec.model_dump(mode="json")],
            task_id=job_id,
            queue=queue_name(self.settings),
            soft_time_limit=soft,
            time_limit=hard,
            argsrepr=repr([spec.mode.value, spec.question[:QUESTION_SHOWN_CHARS]]),
            kwargsrepr=repr({"job_id": job_id, "priority": priority}),
            priority=broker_priority(priority),
            producer=producer,
        )

    def send_all(self, jobs: list[tuple[str, JobSpec]]) -> int:
        """Send every job's message over one connection; returns how many were sent.

        Raises:
            PublishError: sending failed after ``sent`` messages (the cause is chained).
        """
        sent = 0
        try:
            with self.app.producer_or_acquire() as producer:
                for job_id, spec in jobs:
                    self.send(job_id, spec, producer)
                    sent += 1
        except Exception as e:
            raise PublishError(sent) from e
        return sent

    def republish(self, reader: RecordReader, job_id: str) -> bool:
        """Publish a recorded, unfinished job's message again (its message was lost); False if it ended.

        Raises:
            JobNotFoundError: the job has no record (expired).
            redis.RedisError: the record cannot be read.
        """
        record = reader.record(job_id)
        if record.status.is_final or record.spec is None:
            return False
        self.send(job_id, record.spec)
        return True


class PublishError(Exception):
    """Publishing stopped after ``sent`` messages; the broker's error is the ``__cause__``."""

    def __init__(self, sent: int) -> None:
        super().__init__(sent)
        self.sent = sent
