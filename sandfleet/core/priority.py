"""Job priorities: the range users write, the defaults, and how the broker is told.

A job's ``priority`` is 0 (lowest) to 9 (highest); a waiting job of higher priority is taken before
any of lower priority, in submission order within one priority. A job submitted alone defaults to
:data:`DEFAULT_JOB_PRIORITY`, a job of a batch to :data:`DEFAULT_BATCH_PRIORITY`, so the one question
someone waits for overtakes a large batch's backlog. Priority orders the queue only: a running job is
never paused for a more urgent one.

The broker is kombu's Redis transport, which keeps one list per priority step and serves them in
order, **0 first** (``priority_steps``; the opposite of AMQP). :func:`broker_priority` turns ours
(9 = most urgent) into kombu's (0 = served first), so users never meet the inversion.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import redis

MIN_PRIORITY = 0
MAX_PRIORITY = 9
DEFAULT_JOB_PRIORITY = 5  # `sandfleet submit`, Client.submit
DEFAULT_BATCH_PRIORITY = 3  # `sandfleet batch`, Client.submit_batch: below single jobs

# Broker transport options both sides need: the producer publishes into the list of the message's
# step, the worker's BRPOP names every step's list in order. One step per priority.
BROKER_PRIORITY_OPTIONS: dict[str, Any] = {
    "priority_steps": list(range(MIN_PRIORITY, MAX_PRIORITY + 1)),
    "queue_order_strategy": "priority",
}
KOMBU_SEP = "\x06\x16"  # kombu's separator between a queue's name and its priority step


def priority_lists(queue: str) -> tuple[str, ...]:
    """The broker lists of ``queue``: its own (step 0, the most urgent) and one per other step."""
    steps = BROKER_PRIORITY_OPTIONS["priority_steps"]
    return (queue, *(f"{queue}{KOMBU_SEP}{step}" for step in steps if step))


def queue_length(client: redis.Redis, queue: str) -> int:
    """Messages waiting in ``queue``, every priority step's list counted."""
    pipe = client.pipeline(transaction=False)
    for key in priority_lists(queue):
        pipe.llen(key)
    return sum(int(n) for n in pipe.execute())


def broker_priority(priority: int) -> int:
    """Kombu's Redis priority (0 is served first) for a job priority (9 is the most urgent)."""
    if not MIN_PRIORITY <= priority <= MAX_PRIORITY:
        raise ValueError(f"priority must be {MIN_PRIORITY}-{MAX_PRIORITY}, got {priority}")
    return MAX_PRIORITY - priority


def effective_priority(priority: int | None, batch_id: str | None) -> int:
    """A job's priority: its own, else the default of a batch job or of a single job."""
    if priority is not None:
        return priority
    return DEFAULT_BATCH_PRIORITY if batch_id else DEFAULT_JOB_PRIORITY
