"""What isolation a container made from given options shows from inside: the isolation probe's view.

Compares OCI runtimes (benchmarks/oci_runtimes.py: a candidate must show exactly runc's view under
the sandbox's own options) and backs the tests that the probe tells a weaker sandbox from the real one.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from sandfleet.worker.sandbox.docker import backend as engine

PROBE = (Path(__file__).resolve().parents[1] / "inside" / "isolation_probe.py").read_text()
# A sandbox has no log (spec.py); the probe's report is read back from one.
PROBE_LOG = {"type": "json-file", "config": {}}


def isolation_view(client: Any, kwargs: dict[str, Any], timeout_s: float = 60) -> dict[str, Any]:
    """Run the probe in a container made from ``containers.create`` keyword arguments; its report.

    Raises:
        SandboxError: the probe did not exit 0 (the engine's error or the probe's output is in it).
    """
    from sandfleet.core.errors import SandboxError

    options = {**kwargs, "command": ["python3", "-c", PROBE], "stdin_open": False, "log_config": PROBE_LOG}
    container_id = engine.create_container(client, options)
    try:
        client.api.start(container_id)
        status = client.api.wait(container_id, timeout=timeout_s)
        output = client.api.logs(container_id).decode(errors="replace")
    finally:
        client.api.remove_container(container_id, force=True)
    if status.get("StatusCode") != 0:
        raise SandboxError(f"the isolation probe exited {status}: {output[-500:]}")
    return dict(json.loads(output))


def view_differences(reference: dict[str, Any], other: dict[str, Any]) -> dict[str, Any]:
    """{aspect: (reference's, other's)} for every aspect that differs; mounts as the entries each
    alone has."""
    found: dict[str, Any] = {}
    for key in sorted(set(reference) | set(other)):
        mine, theirs = reference.get(key), other.get(key)
        if mine == theirs:
            continue
        if key == "mounts" and isinstance(mine, list) and isinstance(theirs, list):
            only = lambda a, b: [m for m in a if m not in b]  # noqa: E731
            found[key] = (only(mine, theirs), only(theirs, mine))
        else:
            found[key] = (mine, theirs)
    return found
