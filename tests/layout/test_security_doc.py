"""SECURITY.md's threat model by boundary names, for every input, the test that proves its mechanism.
A reviewer checks those rows line by line; here is checked that each row has the table's five columns
and says which test proves it (or says plainly that none does), and that every test it names exists:
``tests/PATH.py::test_name`` is a ``def test_name`` in that file (a parametrised id such as ``[runc]``
is not part of the name). Read from the text, nothing imported: a renamed or deleted test fails here.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from .imports import ROOT

SECURITY = ROOT / "SECURITY.md"
SECTION = "## Threat model by boundary"
HEADER = "| input | who controls it | what they could gain | mechanism that stops it | test that proves it |"
TEST_REFERENCE = re.compile(r"(tests/[\w/]+\.py)::(\w+)(?:\[[^\]\s]*\])?")
# A row that proves nothing itself says so, or points at the row that does ("see ...").
NO_TEST = ("not tested", "see ")


def threat_model() -> str:
    """The section's text: from its heading to the next heading of the same level."""
    text = SECURITY.read_text(encoding="utf-8")
    start = text.index(SECTION)
    end = text.find("\n## ", start + len(SECTION))
    return text[start : end if end != -1 else len(text)]


def table_rows(section: str) -> list[list[str]]:
    """The cells of every table row of ``section`` (headers and separator lines left out)."""
    rows = []
    for line in section.splitlines():
        if not line.startswith("|") or line == HEADER or set(line) <= set("|- "):
            continue
        rows.append([cell.strip() for cell in line.strip().strip("|").split("|")])
    return rows


def defined_tests(path: Path) -> set[str]:
    """Names of the test functions defined in ``path`` (module level, or methods of a class)."""
    return set(re.findall(r"^\s*(?:async\s+)?def\s+(test_\w+)\s*\(", path.read_text(encoding="utf-8"), re.M))


def test_the_section_exists_and_every_table_has_the_five_columns() -> None:
    section = threat_model()
    assert HEADER in section
    tables = section.count(HEADER)
    separators = section.count("\n|---|---|---|---|---|")
    assert tables >= 10 and separators == tables, (tables, separators)
    every_header = [line for line in section.splitlines() if line.startswith("| input |")]
    assert every_header == [HEADER] * tables, "each table uses the same five column names"


def test_every_row_has_five_cells_and_names_its_test_or_says_there_is_none() -> None:
    rows = table_rows(threat_model())
    assert len(rows) > 100
    wrong_width = [row[0] for row in rows if len(row) != 5]
    assert wrong_width == [], "a row with a '|' inside a cell, or a cell missing"
    silent = [row[0] for row in rows if not TEST_REFERENCE.search(row[4]) and not row[4].startswith(NO_TEST)]
    assert silent == [], "name the test, or write 'not tested'"


def test_every_test_named_in_the_threat_model_exists() -> None:
    references = sorted({(path, name) for path, name in TEST_REFERENCE.findall(threat_model())})
    assert references, "the section names no test at all"
    missing = []
    for path, name in references:
        file = ROOT / path
        if not file.is_file() or name not in defined_tests(file):
            missing.append(f"{path}::{name}")
    assert missing == []


@pytest.mark.parametrize(
    ("text", "found"),
    [
        ("`tests/a/test_b.py::test_c`", [("tests/a/test_b.py", "test_c")]),
        (
            "`tests/a/test_b.py::test_c[runc]`; tests/d.py::test_e",
            [("tests/a/test_b.py", "test_c"), ("tests/d.py", "test_e")],
        ),
        ("test_c alone, or tests/a/test_b.py without a name", []),
    ],
)
def test_the_reference_pattern_strips_parametrised_ids(text: str, found: list[tuple[str, str]]) -> None:
    assert TEST_REFERENCE.findall(text) == found


def test_defined_tests_sees_functions_and_methods_only(tmp_path: Path) -> None:
    module = tmp_path / "test_m.py"
    module.write_text(
        "def test_a():\n    pass\n\nclass TestX:\n    async def test_b(self):\n        pass\n\n"
        "def helper_test_c():\n    pass\n# def test_d(): a comment is not a definition\n"
    )
    assert defined_tests(module) == {"test_a", "test_b"}
