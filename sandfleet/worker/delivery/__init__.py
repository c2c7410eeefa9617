"""The delivery: the Celery app and task, worker state, presence and recovery, the job's end."""
