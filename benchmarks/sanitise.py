"""What escaping text for the terminal costs per call (sandfleet/core/terminal_text.py).

    .venv/bin/python benchmarks/sanitise.py [--calls 200000] [--kib 100] [--rounds 5]

Every field a command prints goes through it, so it must be cheap next to the print itself:
- one-line fields (escape_line): an ASCII job id (the fast path: ``str.isprintable``), a file name
  with non-ASCII letters (the regex scan), a hostile name (the scan and its replacements);
- a program listing of ``--kib`` KiB (escape_program: line ends as Python reads them, then the scan),
  ASCII and with non-ASCII comments, and the same text with an escape sequence per line;
- a ``--json`` output (json_text: ``json.dumps`` then escape_json) against ``json.dumps`` alone.

Per call: the median over ``--rounds`` rounds of ``--calls`` calls (fields) or of enough calls to take
a tenth of a second (listings, JSON). No process, no I/O: pure CPU on the calling thread.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable
from typing import Any

from sandfleet.core.console import json_text
from sandfleet.core.terminal_text import escape_line, escape_program

ASCII_LINE = "    total = sum(r['quantity'] * r['unit_price'] for r in rows if r['region'] == region)\n"
UNICODE_LINE = "    totals[region] = round(total, 2)  # Zürich, 東京: per region, highest first\n"
HOSTILE_LINE = "    x = 1  # \x1b[2J\x1b]0;title\x07 \u202eevil\u202c\rissue_refund()\n"


def per_call_s(func: Callable[[Any], Any], value: Any, calls: int, rounds: int) -> float:
    """The median over ``rounds`` of the mean time of one call of ``func(value)``, in seconds."""
    samples = []
    for _ in range(rounds):
        start = time.perf_counter()
        for _ in range(calls):
            func(value)
        samples.append((time.perf_counter() - start) / calls)
    return statistics.median(samples)


def calls_for(func: Callable[[Any], Any], value: Any, budget_s: float = 0.1) -> int:
    start = time.perf_counter()
    func(value)
    return max(1, int(budget_s / max(time.perf_counter() - start, 1e-9)))


def listing(line: str, kib: int) -> str:
    return line * max(1, kib * 1024 // len(line.encode()))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=200_000, help="Calls per round for one-line fields.")
    parser.add_argument("--kib", type=int, default=100, help="Size of the program listing, KiB.")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()

    print(f"one-line fields (escape_line), {args.calls} calls x {args.rounds} rounds:")
    fields = {
        "ASCII job id": "8a30afb1-5a55-41b6-9d4f-d12d161182f3",
        "non-ASCII file name": "Umsatz Zürich 東京 Q3-2026.csv",
        "hostile file name": "\x9b2J\u202etxt.exe\x1b]8;;x\x1b\\",
    }
    for name, value in fields.items():
        cost = per_call_s(escape_line, value, args.calls, args.rounds)
        print(f"  {name:<22} {len(value):>4} chars: {cost * 1e6:7.3f} us per call")

    print(f"program listing (escape_program), {args.kib} KiB:")
    for name, line in (
        ("ASCII", ASCII_LINE),
        ("non-ASCII comments", UNICODE_LINE),
        ("hostile", HOSTILE_LINE),
    ):
        text = listing(line, args.kib)
        cost = per_call_s(escape_program, text, calls_for(escape_program, text), args.rounds)
        per_char_ns = cost / len(text) * 1e9
        print(
            f"  {name:<22} {len(text):>7} chars: {cost * 1e3:7.3f} ms per call ({per_char_ns:.1f} ns a character)"
        )

    value = {
        "job_id": fields["ASCII job id"],
        "status": "succeeded",
        "result": {"North America": 108664.0, "LATAM": 81328.0, "EMEA": 77689.0, "APAC": 65023.0},
        "final_program": listing(UNICODE_LINE, 4),
        "artifacts": [{"name": fields["non-ASCII file name"], "size": 1234, "sha256": "ab" * 32}],
    }
    plain = per_call_s(
        lambda v: json.dumps(v, ensure_ascii=False), value, calls_for(json.dumps, value), args.rounds
    )
    escaped = per_call_s(json_text, value, calls_for(json_text, value), args.rounds)
    size = len(json_text(value))
    print(f"--json of a JobResult-like value ({size} chars):")
    print(
        f"  json.dumps {plain * 1e6:8.1f} us, json_text {escaped * 1e6:8.1f} us: ratio {escaped / plain:.2f}"
    )


if __name__ == "__main__":
    main()
