"""The mode x feature table of docs/modes.md ("Every feature in every mode", issue 26 point 7) has no
empty cell, and every test a cell names exists: a feature added in one mode shows up as a gap here."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
MODES_DOC = REPO / "docs" / "modes.md"
HEADING = "#### Every feature in every mode"
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


def section() -> str:
    text = MODES_DOC.read_text()
    assert HEADING in text, f"{MODES_DOC} lost its section {HEADING!r}"
    body = text.split(HEADING, 1)[1]
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
