"""The layer both sides depend on: contracts, settings, Redis keys, job records (read and write),
the audit chain, errors and the shared Celery configuration. Imports no other Sandfleet room."""
