"""Example tools over the reference scenario's data folder: orders, confined file reading, a side effect.

Load them with ``SANDFLEET_TOOLS=worker.tools.examples.orders,worker.tools.examples.files``.
"""
