"""Text for a person's terminal: every character that could steer the terminal or hide text, shown.

A program, a model, a submitter, an MCP server or whoever can write Redis controls most of what the
CLI prints (questions, programs, RESULT payloads, file and tool names, error messages). Printed raw,
ESC/CSI sequences repaint an approver's screen or retitle the window (``ESC[2J``, ``ESC]0;...BEL``),
OSC 8 makes a link whose text lies about its target, ``\\r`` and backspace overwrite what was shown,
and bidi overrides or zero-width characters make ``approve`` read as something else. Every such
character is replaced by its Python escape, visibly, as ``repr`` writes it: ESC -> ``\\x1b``,
CR -> ``\\r``, U+202E -> ``\\u202e``, U+E0041 -> ``\\U000e0041``. Letters of every script are left
alone ("Zürich", "東京" print as they are).

Escaped (UNSAFE_RANGES, checked against ``unicodedata`` by tests/core/test_terminal_text.py):
- C0 controls U+0000-001F (ESC, BEL, BS, CR, ...), DEL, and C1 controls U+0080-009F (CSI 0x9b, OSC 0x9d);
- format characters (category Cf): bidi embeddings/overrides U+202A-202E and isolates U+2066-2069,
  the marks U+200E/200F/061C, zero-width space/joiners U+200B-200D, word joiner and invisible
  operators U+2060-2064, BOM U+FEFF, soft hyphen, tag characters U+E0001-E007F, ...;
- line and paragraph separators U+2028/2029 (terminals and editors break lines there, Python does not);
- surrogates (a lone one cannot even be encoded: printing it would crash the command);
- the invisible "letters" and fillers of the Default_Ignorable set that are not Cf (U+034F, Hangul
  fillers U+115F/1160/3164/FFA0, Khmer U+17B4/17B5, Mongolian selectors U+180B-180F, U+FFF0-FFF8,
  the rest of U+E0000-E0FFF). Variation selectors U+FE00-FE0F stay: emoji need them.
  An emoji joined by ZWJ therefore shows its ``\\u200d``s: the joiner also hides text between letters.

Which whitespace a field keeps is decided per field, by which function prints it:
- :func:`escape_line` keeps nothing: one-line fields (a file, tool, worker or approver name, an id,
  a reason) cannot fake another line or column of a listing;
- :func:`escape_text` keeps newline and tab: multi-line text meant to keep its lines (a program
  listing, a RESULT text, an error message). ``\\r`` is always escaped, ``\\r\\n`` shows as ``\\r``
  at the end of a line, so an overwrite can never hide;
- :func:`escape_program` is :func:`escape_text` for a Python program: its line ends are the ones
  Python reads (``\\r\\n``, ``\\r`` and ``\\n``), so code after a lone ``\\r`` shows on the line of its
  own that Python runs it on, not hidden at the end of a comment; U+2028 and friends, which Python
  does not break lines at, are escaped;
- :func:`escape_json` is for JSON text (``--json`` outputs): each unsafe character becomes a JSON
  ``\\uXXXX`` escape (surrogate pairs above U+FFFF), so the JSON still parses back to the exact
  original strings. ``json.dumps`` escapes only U+0000-001F; DEL, C1 and bidi characters it leaves
  raw (with ``ensure_ascii=False``, as the CLI prints to show non-ASCII letters).

Not reversible, on purpose: a backslash is not doubled, so plain text with backslashes (Windows
paths, ``"\\n"`` in a program) prints unchanged, and escaping twice gives the same text as once
(no unsafe character is left after one pass). Text that already holds the four characters ``\\x1b``
looks like an escaped ESC; the exact value is in ``--json``.

Cost (benchmarks/sanitise.py; figures from a quick run on the loaded 2-core host, to be taken again
on a quiet one): one regex scan, of the table's ASCII part when the text is ASCII (about 5-10 ns a
character), of its BMP part otherwise, and of the rest only for text holding characters above U+FFFF
(see _Scanner). A one-line ASCII field that is already printable returns after ``str.isprintable``
(about 0.15 µs for a 36-character job id); a 100 KiB program listing takes about 1 ms.
"""

from __future__ import annotations

import re
from collections.abc import Callable

# (first, last, what): every code point a person's terminal must not receive raw, in order.
UNSAFE_RANGES: tuple[tuple[int, int, str], ...] = (
    (0x0000, 0x001F, "C0 controls: NUL, BEL, BS, TAB, LF, CR, ESC, ..."),
    (0x007F, 0x009F, "DEL and the C1 controls: CSI 0x9b, OSC 0x9d, ST 0x9c, NEL 0x85, ..."),
    (0x00AD, 0x00AD, "soft hyphen"),
    (0x034F, 0x034F, "combining grapheme joiner (invisible)"),
    (0x0600, 0x0605, "Arabic number signs (format)"),
    (0x061C, 0x061C, "Arabic letter mark (bidi)"),
    (0x06DD, 0x06DD, "Arabic end of ayah (format)"),
    (0x070F, 0x070F, "Syriac abbreviation mark (format)"),
    (0x0890, 0x0891, "Arabic pound/piastre marks above (format)"),
    (0x08E2, 0x08E2, "Arabic disputed end of ayah (format)"),
    (0x115F, 0x1160, "Hangul choseong/jungseong fillers (invisible)"),
    (0x17B4, 0x17B5, "Khmer inherent vowels (invisible)"),
    (0x180B, 0x180F, "Mongolian variation selectors and vowel separator (invisible)"),
    (0x200B, 0x200F, "zero-width space, ZWNJ, ZWJ, LRM, RLM"),
    (0x2028, 0x2029, "line and paragraph separators"),
    (0x202A, 0x202E, "bidi embeddings, pop, overrides (LRE RLE PDF LRO RLO)"),
    (0x2060, 0x2064, "word joiner, invisible function application/times/separator/plus"),
    (0x2065, 0x2065, "reserved, default-ignorable"),
    (0x2066, 0x2069, "bidi isolates (LRI RLI FSI PDI)"),
    (0x206A, 0x206F, "deprecated format characters (symmetric swapping, digit shapes)"),
    (0x3164, 0x3164, "Hangul filler (invisible)"),
    (0xD800, 0xDFFF, "surrogates (unprintable on their own)"),
    (0xFEFF, 0xFEFF, "zero-width no-break space (BOM)"),
    (0xFFA0, 0xFFA0, "halfwidth Hangul filler (invisible)"),
    (0xFFF0, 0xFFF8, "reserved, default-ignorable"),
    (0xFFF9, 0xFFFB, "interlinear annotation anchor/separator/terminator"),
    (0x110BD, 0x110BD, "Kaithi number sign (format)"),
    (0x110CD, 0x110CD, "Kaithi number sign above (format)"),
    (0x13430, 0x1343F, "Egyptian hieroglyph format controls"),
    (0x1BCA0, 0x1BCA3, "shorthand format controls"),
    (0x1D173, 0x1D17A, "musical symbol beam/tie/slur/phrase format controls"),
    (0xE0000, 0xE0FFF, "tag characters and variation selectors supplement (invisible)"),
)
KEPT_IN_TEXT = "\t\n"  # what escape_text leaves raw


def _char_class(ranges: tuple[tuple[int, int, str], ...], keep: str = "") -> str:
    """A regex character class of ``ranges`` minus the characters of ``keep``."""
    parts = []
    for first, last, _ in ranges:
        start = first
        for cp in sorted(ord(c) for c in keep if first <= ord(c) <= last):
            if start < cp:
                parts.append((start, cp - 1))
            start = cp + 1
        if start <= last:
            parts.append((start, last))
    return "[" + "".join(f"\\U{a:08x}" if a == b else f"\\U{a:08x}-\\U{b:08x}" for a, b in parts) + "]"


def _clipped(low: int, high: int) -> tuple[tuple[int, int, str], ...]:
    return tuple((max(a, low), min(b, high), w) for a, b, w in UNSAFE_RANGES if a <= high and b >= low)


_ANY_ASTRAL = re.compile("[\\U00010000-\\U0010ffff]")


class _Scanner:
    """The table as three regexes, because the engine tests a class of characters below U+10000 with
    bitmaps but one above it range by range (measured: about 5 ns a character for the ASCII or the
    BMP class, 40-55 ns for the whole table): ASCII text (``str.isascii`` is a flag) is scanned for
    the ASCII part only, other text for the BMP part, and for the rest only if it has a character
    above U+FFFF at all."""

    def __init__(self, keep: str = "") -> None:
        self.ascii = re.compile(_char_class(_clipped(0, 0x7F), keep))
        self.bmp = re.compile(_char_class(_clipped(0, 0xFFFF), keep))
        self.astral = re.compile(_char_class(_clipped(0x10000, 0x10FFFF), keep))

    def sub(self, replace: Callable[[re.Match[str]], str], text: str) -> str:
        if text.isascii():
            return self.ascii.sub(replace, text)
        text = self.bmp.sub(replace, text)
        return self.astral.sub(replace, text) if _ANY_ASTRAL.search(text) else text


_EVERY_UNSAFE = _Scanner()
_UNSAFE_IN_TEXT = _Scanner(keep=KEPT_IN_TEXT)


_SHORT_ESCAPES = {"\t": "\\t", "\n": "\\n", "\r": "\\r"}  # as repr() writes them


def _python_escape(match: re.Match[str]) -> str:
    char = match.group()
    if char in _SHORT_ESCAPES:
        return _SHORT_ESCAPES[char]
    cp = ord(char)
    if cp < 0x100:
        return f"\\x{cp:02x}"
    return f"\\u{cp:04x}" if cp < 0x10000 else f"\\U{cp:08x}"


def _json_escape(match: re.Match[str]) -> str:
    cp = ord(match.group())
    if cp < 0x10000:
        return f"\\u{cp:04x}"
    cp -= 0x10000
    return f"\\u{0xD800 + (cp >> 10):04x}\\u{0xDC00 + (cp & 0x3FF):04x}"


def escape_line(text: str) -> str:
    """``text`` for one line of a terminal: every unsafe character escaped, newline and tab included."""
    if text.isascii() and text.isprintable():  # the common case, in C: none of UNSAFE_RANGES
        return text
    return _EVERY_UNSAFE.sub(_python_escape, text)


def escape_text(text: str) -> str:
    """``text`` that keeps its lines and tabs; every other unsafe character escaped."""
    return _UNSAFE_IN_TEXT.sub(_python_escape, text)


_PYTHON_LINE_END = re.compile(r"\r\n?")


def escape_program(source: str) -> str:
    """A Python program's text with its lines as Python reads them (every line end a newline), each
    line escaped as :func:`escape_text` escapes."""
    return escape_text(_PYTHON_LINE_END.sub("\n", source))


def escape_json(text: str) -> str:
    """JSON text with every unsafe character as a JSON ``\\u`` escape; newline and tab (the layout of
    indented JSON) kept. Applied to ``json.dumps`` output it parses back to the same value: outside
    strings JSON holds only ASCII punctuation, digits, letters and the layout's whitespace."""
    return _UNSAFE_IN_TEXT.sub(_json_escape, text)
