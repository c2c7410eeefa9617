"""Example tools over the reference scenario's data folder: orders, confined file reading, a side effect.

Load them with ``SANDFLEET_TOOLS=sandfleet.worker.tools.examples.orders,sandfleet.worker.tools.examples.files``.
"""
