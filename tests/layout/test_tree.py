"""The tree a newcomer walks (issue 23): every file at one path, the worker's code in rooms, and no
``assert`` deciding anything where a record is checked or delivered.

- No symlinks: ``sandfleet/producer`` and ``sandfleet/worker`` once were links to top-level folders,
  so every file had two paths (IDEs, packaging and Windows checkouts tripped on them).
- No loose modules in ``sandfleet/worker/``: a module belongs to the room of its stage.
- No ``assert`` in ``sandfleet/core`` and ``sandfleet/worker/delivery``: ``python -O`` strips them, so
  a check written as one passes silently (or crashes on None) in an optimized run. The rule has no
  exception for narrowing a type: an explicit ``if x is None`` that fails closed says what happened,
  where an assert would only have narrowed (tests/core/test_optimized_mode.py runs the checks under -O).
- No test module imports another test module: what tests share lives in ``tests/sandfleet_testing/``
  or a folder's helpers, so that running one test file never collects another's tests.
"""

from __future__ import annotations

import ast
import re
import subprocess

from .imports import PACKAGE_DIR, ROOT

NO_ASSERT_ROOMS = ("core", "worker/delivery")
TEST_IMPORT = re.compile(
    r"^\s*(?:from\s+(?:[\w.]*\.)?test_\w*\s+import|import\s+(?:[\w.]*\.)?test_\w*)", re.M
)


def test_the_tree_has_no_symlinks() -> None:
    listed = subprocess.run(
        ["git", "ls-files", "-s"], cwd=ROOT, capture_output=True, text=True, check=True, timeout=30
    ).stdout
    links = [line.split("\t", 1)[1] for line in listed.splitlines() if line.startswith("120000 ")]
    assert links == [], f"symlinks in the tree (each file gets two paths): {links}"


def test_the_worker_has_no_loose_modules() -> None:
    loose = sorted(p.name for p in (PACKAGE_DIR / "worker").glob("*.py") if p.name != "__init__.py")
    assert loose == [], f"modules outside a room in sandfleet/worker/: {loose} (put each in its stage's room)"


def test_no_assert_where_records_are_checked_or_delivered() -> None:
    found = []
    for room in NO_ASSERT_ROOMS:
        for path in sorted((PACKAGE_DIR / room).rglob("*.py")):
            tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
            found += [
                f"{path.relative_to(ROOT)}:{n.lineno}" for n in ast.walk(tree) if isinstance(n, ast.Assert)
            ]
    assert found == [], f"assert is stripped by python -O; check explicitly and fail closed: {found}"


def test_no_test_module_imports_another() -> None:
    found = [
        f"{path.relative_to(ROOT)}: {m.group(0).strip()}"
        for path in sorted((ROOT / "tests").rglob("*.py"))
        for m in TEST_IMPORT.finditer(path.read_text(encoding="utf-8"))
    ]
    assert found == [], f"move what they share into tests/sandfleet_testing/ or the folder's helpers: {found}"
