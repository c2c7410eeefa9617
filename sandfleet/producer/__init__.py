"""The producer: the client that enqueues jobs and reads their records, and its CLI commands.

Imports only :mod:`sandfleet.core`: never ``docker``, ``openai`` or worker code.
"""
