"""Tools from MCP servers, bridged into the program beside the Python tools.

The only package that imports the ``mcp`` SDK. One responsibility per module:

- ``config``: the operator's ``mcpServers`` file, checked (errors name the line and the field;
  ``jsonmap`` finds the lines);
- ``sessions``: every server connected once per worker process, restarted with backoff, stopped with
  the engine's services; thread-safe, concurrent calls; every SDK error translated here
  (``errors``: what the program sees); ``stdio_transport`` and ``http_transport`` carry the bytes,
  with bounds (``wire`` keeps what a connection saw);
- ``listing``: what a server offers (tools, resources), read at connection and after each change;
  ``liveness``: list-changed notifications (rate-limited refreshes) and the periodic ping;
  ``status``: a server's state for doctor, the metrics and the worker's heartbeat report;
- ``names``: collision-free Python identifiers for the servers' tools;
- ``schema``: a tool's input schema as a Python signature, and the host-side check of a call;
- ``results``: a ``CallToolResult`` as the program's value; ``resources``: which URIs a program may
  read (listed, or matching a template) and a read as the program's value;
- ``tools``: MCP tools as registry tools; ``catalog``: Python and MCP tools as one registry, and the
  check that a job's MCP servers are up.
"""
