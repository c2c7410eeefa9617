"""Replay scripts several test packages start their workers with (``WorkerFactory(script=...)``)."""

from __future__ import annotations

import json
from pathlib import Path


def replay_script(folder: Path) -> Path:
    """A script that answers the reference question with the reference program and fails anything else."""
    from sandfleet.worker.tools.examples.scenario import REFERENCE_PROGRAM

    reply = f"The totals come from the orders tool.\n\n```python\n{REFERENCE_PROGRAM}```\n"
    script = {
        "rules": [{"match": "(?i)revenue per region", "responses": [reply]}],
        "default": ["```python\nprint('RESULT: ' + 'no rule matched')\n```"],
    }
    path = folder / "script.json"
    path.write_text(json.dumps(script))
    return path
