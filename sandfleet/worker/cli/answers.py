"""Whether an answer matches the expected one, field by field: pure, for ``compare`` and the demo.

The expected answer is JSON. A job's answer is the payload of its RESULT line (JSON when it parses)
or, for a tool-loop reply without one, its text. The check is generous to both:

- numbers match within ``tolerance`` (a cent by default), whatever their JSON type;
- a mapping is checked key by key (keys that are missing, or extra, do not match); a list of
  ``[key, value]`` pairs or of ``{"name": .., <number>: ..}`` objects counts as that mapping;
- a text answer against an expected mapping is read as prose: each key must appear, followed by its
  number (``North America: $108,664.00`` reads as 108664.0);
- texts match when equal but for case and surrounding space; lists item by item.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any

CENT = 0.005
_NUMBER = r"-?\d[\d,]*(?:\.\d+)?|-?\.\d+"


@dataclass(frozen=True)
class FieldCheck:
    """One key of an expected mapping: what was expected, what the answer said (None: nothing)."""

    key: str
    expected: Any
    got: Any
    ok: bool


@dataclass(frozen=True)
class AnswerCheck:
    """The verdict: ``matches``, and for mappings each key's check (``fields``) and keys not expected."""

    matches: bool
    fields: list[FieldCheck] = field(default_factory=list)
    extra: list[str] = field(default_factory=list)
    read_as: str = "json"  # or "text": the answer was prose, numbers read from it

    def summary(self) -> str:
        """``yes``, or ``NO`` with what was wrong (``2 of 4 wrong: North America 109555 (expected 108664)``)."""
        if self.matches:
            return "yes"
        wrong = [f for f in self.fields if not f.ok]
        if not self.fields:
            return "NO"
        parts = [f"{f.key} {_shown(f.got)} (expected {_shown(f.expected)})" for f in wrong]
        if self.extra:
            parts.append(f"not expected: {', '.join(self.extra)}")
        return f"NO: {len(wrong)} of {len(self.fields)} wrong: " + "; ".join(parts)


def check_answer(expected: Any, answer: Any, *, tolerance: float = CENT) -> AnswerCheck:
    """Compare ``answer`` with ``expected`` by the rules above."""
    if isinstance(expected, dict):
        got: dict[str, Any] | None
        if isinstance(answer, str):
            got, read_as = numbers_in_text(answer, list(expected)), "text"
        else:
            got, read_as = as_mapping(answer), "json"
        if got is None:
            fields = [FieldCheck(str(k), v, None, False) for k, v in expected.items()]
            return AnswerCheck(False, fields, [], read_as)
        fields = [
            FieldCheck(str(k), v, got.get(str(k)), same(v, got.get(str(k)), tolerance))
            for k, v in expected.items()
        ]
        extra = [k for k in got if k not in {str(e) for e in expected}] if read_as == "json" else []
        return AnswerCheck(all(f.ok for f in fields) and not extra, fields, extra, read_as)
    return AnswerCheck(same(expected, answer, tolerance))


def same(expected: Any, got: Any, tolerance: float = CENT) -> bool:
    """Equal by the module's rules (numbers within ``tolerance``, text but for case and space)."""
    if _is_number(expected) and _is_number(got):
        return math.isclose(float(expected), float(got), abs_tol=tolerance)
    if _is_number(expected) and isinstance(got, str):
        parsed = _number(got.strip().lstrip("$€£"))
        return parsed is not None and math.isclose(float(expected), parsed, abs_tol=tolerance)
    if isinstance(expected, str) and isinstance(got, str):
        return expected.strip().casefold() == got.strip().casefold()
    if isinstance(expected, list) and isinstance(got, list):
        return len(expected) == len(got) and all(
            same(e, g, tolerance) for e, g in zip(expected, got, strict=True)
        )
    if isinstance(expected, dict):
        return check_answer(expected, got, tolerance=tolerance).matches
    return bool(expected == got)


def as_mapping(answer: Any) -> dict[str, Any] | None:
    """A mapping of an answer: a dict, a list of pairs, or a list of ``{"name": .., <number>: ..}``."""
    if isinstance(answer, dict):
        return {str(k): v for k, v in answer.items()}
    if not isinstance(answer, list):
        return None
    mapping: dict[str, Any] = {}
    for item in answer:
        if isinstance(item, list | tuple) and len(item) == 2:
            mapping[str(item[0])] = item[1]
        elif isinstance(item, dict):
            names = [v for v in item.values() if isinstance(v, str)]
            numbers = [v for v in item.values() if _is_number(v)]
            if len(names) != 1 or len(numbers) != 1:
                return None
            mapping[names[0]] = numbers[0]
        else:
            return None
    return mapping


def numbers_in_text(text: str, keys: list[str]) -> dict[str, Any]:
    """For each key found in ``text``, the first number after it (on the same line, within 60 characters)."""
    found: dict[str, Any] = {}
    for key in keys:
        match = re.search(re.escape(str(key)) + r"[^\n\d-]{0,60}?(" + _NUMBER + ")", text, re.IGNORECASE)
        if match:
            found[str(key)] = _number(match.group(1))
    return found


def _number(text: str) -> float | None:
    try:
        return float(text.replace(",", ""))
    except ValueError:
        return None


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _shown(value: Any) -> str:
    if _is_number(value):
        return f"{value:,.2f}".rstrip("0").rstrip(".") if isinstance(value, float) else f"{value:,}"
    return "nothing" if value is None else repr(value)
