#!/usr/bin/env python3
"""Write the generated references: docs/settings.md (from the typed settings) and docs/cli.md (from the
commands' own --help). Run it after changing either; tests/layout/test_generated_docs.py fails until
the committed files match. ``--check`` only reports which file is stale (exit 1).

Usage: .venv/bin/python deploy/gen_docs.py [--check]
"""

from __future__ import annotations

import sys
from pathlib import Path

from sandfleet import cli_doc
from sandfleet.core import settings_doc

DOCS = Path(__file__).resolve().parents[1] / "docs"
GENERATED = {"settings.md": settings_doc.render, "cli.md": cli_doc.render}


def main(check: bool) -> int:
    stale = []
    for name, render in GENERATED.items():
        path, text = DOCS / name, render()
        if not path.exists() or path.read_text() != text:
            stale.append(name)
            if not check:
                path.write_text(text)
    verb = "stale" if check else "written"
    for name in stale:
        print(f"docs/{name}: {verb}")
    return 1 if check and stale else 0


if __name__ == "__main__":
    sys.exit(main("--check" in sys.argv[1:]))
