"""The engine room (sandfleet/worker/engine/) is held tighter than the house: at most 60 lines and at
most 5 parameters per function (issue 23, "state with a home").

A function that needs more is carrying state that belongs in an object (``CodeActionRun``, the tool
loop's ``_Job``) or a small frozen dataclass (``GatedCall``), not in a longer signature. Counted: every
parameter but ``self``/``cls``, keyword-only ones and those with defaults too (an option is still
something a reader must follow); ``*args``/``**kwargs`` count one each. Lines: from ``def`` to the last
line, docstring included. The allow-list is empty now (the services' options became ``EngineOptions``,
a failed attempt's facts ``AttemptFailure``, a session's install sources ``PackageSources``); an entry
added back must say why it waits, and one that no longer offends fails the test: the list only shrinks.
"""

from __future__ import annotations

import ast
from pathlib import Path

from .imports import functions

ENGINE = Path(__file__).resolve().parents[2] / "sandfleet" / "worker" / "engine"
MAX_LINES = 60
MAX_PARAMETERS = 5

ALLOWED: dict[str, str] = {}  # empty: every engine function is within the limits


def parameters(node: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    """The parameters a caller must know of: all of them but a method's ``self``/``cls``."""
    a = node.args
    names = [*a.posonlyargs, *a.args, *a.kwonlyargs]
    count = len(names) + (a.vararg is not None) + (a.kwarg is not None)
    if names and names[0].arg in ("self", "cls"):
        count -= 1
    return count


def offenders() -> dict[str, str]:
    """``file::qualname`` -> what is over, for every engine function over a limit."""
    found: dict[str, str] = {}
    for path in sorted(ENGINE.rglob("*.py")):
        relative = path.relative_to(ENGINE).as_posix()
        for node, qualname in functions(ast.parse(path.read_text(), filename=str(path)), ""):
            lines = (node.end_lineno or node.lineno) - node.lineno + 1
            over = []
            if lines > MAX_LINES:
                over.append(f"{lines} lines")
            if parameters(node) > MAX_PARAMETERS:
                over.append(f"{parameters(node)} parameters")
            if over:
                found[f"{relative}::{qualname}"] = ", ".join(over)
    return found


def test_engine_functions_are_short_and_take_few_parameters() -> None:
    found = offenders()
    new = [f"sandfleet/worker/engine/{k} ({v})" for k, v in found.items() if k not in ALLOWED]
    assert not new, "give this state a home (an object or a frozen dataclass):\n" + "\n".join(new)


def test_the_allow_list_only_shrinks() -> None:
    stale = sorted(set(ALLOWED) - set(offenders()))
    assert not stale, f"these are within the limits now: drop them from ALLOWED: {stale}"


def test_the_counter_sees_self_apart_and_options_counted() -> None:
    tree = ast.parse(
        "class C:\n    def f(self, a, b, *, c=1, d=2, e=3): pass\n    def g(self, a, *r, **k): pass\n"
    )
    (f, _), (g, _) = functions(tree, "")
    assert parameters(f) == 5 and parameters(g) == 3
