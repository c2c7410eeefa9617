"""The escaping of text for a person's terminal (sandfleet/core/terminal_text.py): pure functions.

Every class of character that steers a terminal or hides text is shown as its Python escape; letters
of every script are left alone; JSON stays JSON and parses back to the exact original value. The
end-to-end side (a real worker, the CLI as a person types it) is tests/security/test_terminal_output.py.
"""

from __future__ import annotations

import itertools
import json
import random
import unicodedata

import pytest

from sandfleet.core.terminal_text import (
    KEPT_IN_TEXT,
    UNSAFE_RANGES,
    escape_json,
    escape_line,
    escape_program,
    escape_text,
)

ESC = "\x1b"
UNSAFE = {cp for first, last, _ in UNSAFE_RANGES for cp in range(first, last + 1)}
# What a hostile program, model, submitter or server would print at an approver.
ATTACKS = {
    "clear screen": f"{ESC}[2J{ESC}[H",
    "window title (OSC 0, BEL)": f"{ESC}]0;approved{chr(7)}",
    "hyperlink (OSC 8)": f"{ESC}]8;;https://bank.invalid/pay{ESC}\\harmless.txt{ESC}]8;;{ESC}\\",
    "8-bit CSI": "\x9b2J\x9b31m",
    "carriage-return overwrite": "rm -rf /\rls -l    ",
    "backspaces": "deny\b\b\b\bapprove",
    "bidi override": "refund_\u202eDI_REDRO\u202c.txt",
    "bidi isolate": "amount \u2067100\u2069 USD",
    "zero width": "pay\u200bpal\u200d\u2060\ufeff",
    "tag characters": "ok\U000e0041\U000e0042",
    "line separator": "one\u2028two\u2029three",
    "hangul filler": "\u3164\u115f",
    "DEL and NEL": "a\x7fb\x85c",
}


def test_every_character_of_the_table_is_escaped_visibly_and_nothing_else() -> None:
    """One code point at a time, all 1,114,112: escaped exactly when the table lists it."""
    for cp in range(0x110000):
        char = chr(cp)
        shown = escape_line(char)
        if cp in UNSAFE:
            expected = f"\\x{cp:02x}" if cp < 0x100 else (f"\\u{cp:04x}" if cp < 0x10000 else f"\\U{cp:08x}")
            assert shown == {9: "\\t", 10: "\\n", 13: "\\r"}.get(cp, expected), hex(cp)
        else:
            assert shown == char, hex(cp)


def test_the_table_holds_every_control_format_separator_and_surrogate_of_this_python() -> None:
    """Cc, Cf, Zl, Zp and Cs as this Python's unicodedata knows them; what the table adds beyond
    those (default-ignorable fillers) are invisible marks, letters or unassigned, never a visible
    symbol or a variation selector that emoji need."""
    categories = {"Cc", "Cf", "Zl", "Zp", "Cs"}
    required = {cp for cp in range(0x110000) if unicodedata.category(chr(cp)) in categories}
    assert required <= UNSAFE, sorted(hex(cp) for cp in required - UNSAFE)[:20]
    extra = {unicodedata.category(chr(cp)) for cp in UNSAFE - required}
    assert extra <= {"Mn", "Lo", "Cn"}, extra
    assert not UNSAFE & set(range(0xFE00, 0xFE10))


def test_the_table_is_sorted_without_overlaps_and_says_what_each_range_is() -> None:
    for (_, last, _), (first, _, _) in itertools.pairwise(UNSAFE_RANGES):
        assert last < first
    assert all(a <= b and what for a, b, what in UNSAFE_RANGES)


@pytest.mark.parametrize("name", sorted(ATTACKS))
def test_no_attack_reaches_the_terminal_raw(name: str) -> None:
    text = ATTACKS[name]
    for escape in (escape_line, escape_text, escape_program):
        shown = escape(text)
        assert not {ord(c) for c in shown} & UNSAFE - {ord(c) for c in KEPT_IN_TEXT}, (escape, shown)
    assert escape_line(text).isprintable()


def test_the_escapes_read_as_python_escapes() -> None:
    assert escape_line(ATTACKS["clear screen"]) == "\\x1b[2J\\x1b[H"
    assert escape_line(ATTACKS["window title (OSC 0, BEL)"]) == "\\x1b]0;approved\\x07"
    assert escape_line(ATTACKS["8-bit CSI"]) == "\\x9b2J\\x9b31m"
    assert escape_line(ATTACKS["carriage-return overwrite"]) == "rm -rf /\\rls -l    "
    assert escape_line(ATTACKS["bidi override"]) == "refund_\\u202eDI_REDRO\\u202c.txt"
    assert escape_line(ATTACKS["tag characters"]) == "ok\\U000e0041\\U000e0042"
    assert escape_line("\ud800") == "\\ud800"  # a lone surrogate: could not even be encoded raw


def test_a_one_line_field_keeps_no_line_break_and_text_keeps_its_lines_and_tabs() -> None:
    text = "name\tsize\nsecond line\r\nthird"
    assert escape_line(text) == "name\\tsize\\nsecond line\\r\\nthird"
    assert escape_text(text) == "name\tsize\nsecond line\\r\nthird"


@pytest.mark.parametrize(
    "plain",
    [
        "Zürich",
        "東京",
        "naïve café, Ærøskøbing, Łódź",
        "שלום עולם",  # right-to-left letters: their order is the text's own, no override
        "مرحبا",
        "Привет",
        "❤️ 👍🏽",  # a variation selector and a skin-tone modifier
        "C:\\Users\\ana\\report.csv",
        "the four characters \\x1b are not an ESC",
        "North America 108,664.00",
        "",
    ],
)
def test_plain_text_of_any_script_is_unchanged(plain: str) -> None:
    assert escape_line(plain) == plain
    assert escape_text(plain) == plain
    assert escape_program(plain) == plain
    assert escape_json(json.dumps(plain, ensure_ascii=False)) == json.dumps(plain, ensure_ascii=False)


def test_escaping_twice_is_escaping_once() -> None:
    """Not reversible (a backslash is not doubled) but idempotent: nothing unsafe is left to escape."""
    rng = random.Random(22)
    pool = [chr(cp) for cp in sorted(UNSAFE)[:400]] + list("ab\\xu01 \n\tЖ東") + list(ATTACKS.values())
    for _ in range(2000):
        text = "".join(rng.choice(pool) for _ in range(rng.randint(0, 12)))
        for escape in (escape_line, escape_text, escape_program):
            once = escape(text)
            assert escape(once) == once


def test_a_program_shows_the_lines_python_runs() -> None:
    """Python ends a line at a lone CR too: the code after it must not hide at the end of a comment.
    U+2028 is no line end for Python: it is escaped, not broken."""
    source = "total = 1  # harmless comment\rissue_refund('O-1', 10**6)\r\nprint(total)\u2028x\n"
    assert escape_program(source).split("\n") == [
        "total = 1  # harmless comment",
        "issue_refund('O-1', 10**6)",
        "print(total)\\u2028x",
        "",
    ]
    assert escape_program("if x:\n\treturn 1\n") == "if x:\n\treturn 1\n"  # tabs are indentation


HOSTILE_VALUES = [
    ATTACKS,
    {ESC + "[2J key": ["\x9b", "\u202e", "\U000e0041", "\ud83d", "\x7f", "tab\there", "nl\nhere"]},
    "Zürich 東京 " + "".join(ATTACKS.values()),
    [1, 2.5, None, True, {"nested": {"deep": "\u2066x\u2069"}}],
]


@pytest.mark.parametrize("indent", [None, 2])
@pytest.mark.parametrize("value", HOSTILE_VALUES, ids=range(len(HOSTILE_VALUES)))
def test_json_stays_exact_and_carries_nothing_raw(value: object, indent: int | None) -> None:
    dumped = json.dumps(value, ensure_ascii=False, indent=indent)
    shown = escape_json(dumped)
    assert json.loads(shown) == value
    assert not {ord(c) for c in shown} & UNSAFE - {ord(c) for c in KEPT_IN_TEXT}
    assert "Zürich 東京" in shown or "Zürich" not in dumped  # letters stay letters


def test_json_escapes_above_the_bmp_as_surrogate_pairs() -> None:
    assert escape_json('"\U000e0041"') == '"\\udb40\\udc41"'
    assert json.loads(escape_json('"\U000e0041"')) == "\U000e0041"
    assert escape_json('"\x9b\u202e"') == '"\\u009b\\u202e"'
