"""Stopping running jobs on a cancel request (the request side is sandfleet/core/cancel.py).

scope.py: each running delivery's :class:`~sandfleet.worker.cancel.scope.CancelToken`, found by job
id, which kills the sandboxes the job holds; model.py: model calls that a cancel abandons;
watcher.py: the worker's thread that hears requests (pub/sub, and a sweep of the pending set) and
acts on them.
"""
