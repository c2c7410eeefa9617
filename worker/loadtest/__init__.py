"""``sandfleet loadtest``: many concurrent jobs through the fleet, measured phase by phase.

Modules, one idea each:

- :mod:`worker.loadtest.stats`   pure: percentiles, per-phase summaries, failures by kind, Redis deltas
- :mod:`worker.loadtest.phases`  pure: how each phase of one job is derived from its record
- :mod:`worker.loadtest.fleet`   a local fleet (its own redis-server, worker subprocesses, data, script)
- :mod:`worker.loadtest.sampler` a background sampler: live sandbox containers and worker RSS
- :mod:`worker.loadtest.driver`  submits the jobs, shows progress, collects records and Redis counts
- :mod:`worker.loadtest.report`  the report dict, report.json, the text summary
- :mod:`worker.loadtest.plot`    report.png (matplotlib, Agg)
"""
