"""No function in sandfleet/ is longer than 80 lines (the team's hard limit; ~60 is the aim).

A long function is where state hides in closures and a reader loses the thread (issue 23). The one
exception is the in-container agent, a standalone script that must stay one file with no imports of
ours. There is no allow-list: the last long functions (the delivery, the code-action run, the shell
job, the program runtime) were split into objects that hold their state.
"""

from __future__ import annotations

import ast
from pathlib import Path

from .imports import functions

PACKAGE = Path(__file__).resolve().parents[2] / "sandfleet"
MAX_FUNCTION_LINES = 80
EXEMPT_FILES = {"worker/sandbox/inside/agent.py"}  # the standalone in-container agent


def longfunctions() -> list[tuple[str, str, int]]:
    """(file relative to sandfleet/, qualified name, lines) of every function over the limit."""
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        relative = path.relative_to(PACKAGE).as_posix()
        if relative in EXEMPT_FILES:
            continue
        tree = ast.parse(path.read_text(), filename=str(path))
        for node, qualname in functions(tree, ""):
            lines = (node.end_lineno or node.lineno) - node.lineno + 1
            if lines > MAX_FUNCTION_LINES:
                found.append((relative, qualname, lines))
    return found


def test_no_function_is_longer_than_80_lines() -> None:
    offenders = [f"sandfleet/{file}::{name} ({lines} lines)" for file, name, lines in longfunctions()]
    assert not offenders, "split these along a seam (at most 80 lines each):\n" + "\n".join(offenders)


def test_the_counter_sees_a_long_function() -> None:
    body = "\n".join(f"    x{i} = {i}" for i in range(MAX_FUNCTION_LINES))
    tree = ast.parse(f"def long():\n{body}\n")
    ((node, name),) = functions(tree, "")
    assert name == "long" and node.end_lineno - node.lineno + 1 > MAX_FUNCTION_LINES  # type: ignore[attr-defined]
