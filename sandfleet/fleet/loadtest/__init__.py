"""``sandfleet loadtest``: many concurrent jobs through the fleet, measured phase by phase.

Modules, one idea each:

- :mod:`sandfleet.fleet.loadtest.stats`   pure: percentiles, per-phase summaries, failures by kind, Redis deltas
- :mod:`sandfleet.fleet.loadtest.phases`  pure: how each phase of one job is derived from its record
- :mod:`sandfleet.fleet.local`   a local fleet (its own redis-server, worker subprocesses, data, script)
- :mod:`sandfleet.fleet.loadtest.sampler` a background sampler: live sandbox containers and worker RSS
- :mod:`sandfleet.fleet.loadtest.driver`  submits the jobs, shows progress, collects records and Redis counts
- :mod:`sandfleet.fleet.loadtest.report`  the report dict, report.json, the text summary
- :mod:`sandfleet.fleet.loadtest.plot`    report.png (matplotlib, Agg)
"""
