"""The mode x feature table of docs/modes.md ("Every feature in every mode", issue 26 point 7) has no
empty cell, and every test a cell names exists: a feature added in one mode shows up as a gap here.
README.md's compact copy has the same rows and columns, no empty cell, each cell a link to the detailed
table, and says "n/a" exactly where docs/modes.md says the feature does not apply."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
MODES_DOC = REPO / "docs" / "modes.md"
README = REPO / "README.md"
HEADING = "#### Every feature in every mode"
README_HEADING = "## Every feature in every mode"
DETAILED = "docs/modes.md#every-feature-in-every-mode"
MODES = ["code-action", "shell", "chat"]
FEATURES = [
    "gated tool",
    "artifacts",
    "MCP tool",
    "cancel",
    "restricted network",
    "completion webhook",
    "verify / replay",
]
LABEL = re.compile(r"\[([A-Z]\d)\]")
NAMED_TEST = re.compile(r"`([\w/]+\.py)::(test_\w+)(?:\[[^\]]*\])?`|`::(test_\w+)(?:\[[^\]]*\])?`")


def section(doc: Path = MODES_DOC, heading: str = HEADING) -> str:
    text = doc.read_text()
    assert heading in text, f"{doc} lost its section {heading!r}"
    body = text.split(heading, 1)[1]
    return body.split("\n####", 1)[0].split("\n## ", 1)[0]


def table(body: str) -> list[list[str]]:
    rows = [line for line in body.splitlines() if line.startswith("|")]
    return [[cell.strip() for cell in row.strip().strip("|").split("|")] for row in rows]


def listed_tests(body: str) -> dict[str, list[tuple[str, str]]]:
    """label -> the (file, test) pairs its list item names (``::name`` continues the last file)."""
    found: dict[str, list[tuple[str, str]]] = {}
    for line in body.splitlines():
        if not line.startswith("- "):
            continue
        labels = re.findall(r"\b([A-Z]\d)\b", line.split("`", 1)[0])
        last_file = ""
        named = []
        for path, name, continued in NAMED_TEST.findall(line):
            if path:
                last_file = path
            assert last_file, f"{line!r}: a ::test before any file"
            named.append((last_file, name or continued))
        for label in labels:
            found.setdefault(label, []).extend(named)
    return found


def test_every_feature_has_a_row_and_every_cell_is_filled() -> None:
    header, rule, *rows = table(section())
    assert header == ["feature", *MODES] and set(rule) == {"---"}
    assert [row[0].split(" (")[0] for row in rows] == FEATURES
    for row in rows:
        assert len(row) == 1 + len(MODES), row
        for mode, cell in zip(MODES, row[1:], strict=True):
            assert cell, f"{row[0]} x {mode}: empty"
            assert LABEL.search(cell) or re.search(r"see `tests/[\w/]+\.py`", cell), (
                f"{row[0]} x {mode}: names no test"
            )


def test_every_label_lists_tests_that_exist() -> None:
    body = section()
    used = {label for row in table(body)[2:] for cell in row[1:] for label in LABEL.findall(cell)}
    listed = listed_tests(body)
    assert used <= listed.keys(), f"labels with no tests listed: {sorted(used - listed.keys())}"
    for label in sorted(used):
        assert listed[label], f"{label} lists no test"
        for path, name in listed[label]:
            source = REPO / "tests" / path
            assert source.is_file(), f"{label}: no file tests/{path}"
            assert re.search(rf"^def {name}\(", source.read_text(), re.M), (
                f"{label}: no {name} in tests/{path}"
            )


def test_the_readmes_table_has_the_same_rows_and_columns_every_cell_filled_and_linked() -> None:
    header, rule, *rows = table(section(README, README_HEADING))
    assert header == ["feature", *MODES] and set(rule) == {"---"}
    assert [row[0] for row in rows] == FEATURES, "README.md's rows differ from docs/modes.md's"
    detailed = {row[0].split(" (")[0]: row[1:] for row in table(section())[2:]}
    for row in rows:
        assert len(row) == 1 + len(MODES), row
        for mode, cell, full in zip(MODES, row[1:], detailed[row[0]], strict=True):
            assert cell, f"README.md: {row[0]} x {mode}: empty"
            assert re.fullmatch(rf"\[[^\]]+\]\({re.escape(DETAILED)}\)", cell), (
                f"README.md: {row[0]} x {mode}: {cell!r} is not a link to {DETAILED}"
            )
            assert cell.startswith("[n/a") == full.startswith("does not apply"), (
                f"{row[0]} x {mode}: README.md says {cell!r}, docs/modes.md {full[:60]!r}"
            )
