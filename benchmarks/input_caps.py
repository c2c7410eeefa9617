"""What the input caps cost per call: the nesting check, RE2 patterns, one-pass uniqueItems.

    .venv/bin/python benchmarks/input_caps.py [--repeat 2000] [--big-mb 8]

Pure host-side work, no sandbox: each figure is the median time of one call, in microseconds, and
beside it what the call guards (``json.loads`` of the same text, Python's ``re``, jsonschema's
pairwise ``uniq``), so the ratio says what the cap adds. Values measured:

  - a small tool request (one argument) and the reference scenario's ``load_orders()`` reply (500 rows);
  - a value nested right at the cap (``MAX_JSON_DEPTH``) and one 100,000 deep (refused);
  - a tool request of ``--big-mb`` MiB of strings (the default request cap is 1 MiB, replies 64 MiB);
  - a reply through the bridge (encode + check), small and the orders;
  - a pattern as real schemas have one (``^[0-9]{5}$``), by RE2 and by ``re``;
  - ``uniqueItems`` over 1,000 objects, one pass against jsonschema's pairwise check.

Figures only: they drift between runs and hosts (run it on a quiet machine); the ratios are what to
compare.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import time
from collections.abc import Callable
from typing import Any


def median_us(call: Callable[[], Any], repeat: int) -> float:
    samples = []
    for _ in range(repeat):
        began = time.perf_counter()
        call()
        samples.append(time.perf_counter() - began)
    return statistics.median(samples) * 1e6


def refused(call: Callable[[], Any]) -> Callable[[], None]:
    def run() -> None:
        try:
            call()
        except (ValueError, RecursionError):  # the cap's refusal; json's own at ~1000 levels
            pass

    return run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=2000, help="calls per figure (the big ones: /100)")
    parser.add_argument("--big-mb", type=float, default=8.0, help="size of the big request, MiB")
    args = parser.parse_args()

    from jsonschema._utils import uniq as pairwise_unique

    from sandfleet.core import json_limits
    from sandfleet.worker.mcp import patterns
    from sandfleet.worker.program.bridge import _encode, _value_reply
    from sandfleet.worker.tools.examples.scenario import generate_orders

    orders = generate_orders()
    small = json.dumps({"id": 1, "tool": "get_order", "args": ["O-0042"], "kwargs": {}}).encode()
    orders_reply = json.dumps({"id": 1, "ok": True, "value": orders}).encode()
    at_cap = ("[" * json_limits.MAX_JSON_DEPTH + "]" * json_limits.MAX_JSON_DEPTH).encode()
    too_deep = ("[" * 100_000 + "]" * 100_000).encode()
    strings = int(args.big_mb * 1024**2 / 12)
    big = json.dumps({"id": 1, "tool": "t", "args": [["abcdefghi"] * strings], "kwargs": {}}).encode()
    n, few = args.repeat, max(3, args.repeat // 100)

    print(
        f"nesting cap {json_limits.MAX_JSON_DEPTH}; median of {n} calls ({few} for the big ones), µs per call"
    )
    rows = [
        (f"small request ({len(small)} B)", lambda: json_limits.check_depth(small, "x", envelope=2), lambda: json.loads(small), n),
        (f"load_orders reply ({len(orders_reply) // 1024} KiB)", lambda: json_limits.check_depth(orders_reply, "x", envelope=1), lambda: json.loads(orders_reply), n),
        (f"nested at the cap ({json_limits.MAX_JSON_DEPTH})", lambda: json_limits.check_depth(at_cap, "x"), lambda: json.loads(at_cap), n),
        ("nested 100,000 deep (refused)", refused(lambda: json_limits.check_depth(too_deep, "x")), refused(lambda: json.loads(too_deep)), few),
        (f"request of {args.big_mb:g} MiB", lambda: json_limits.check_depth(big, "x", envelope=2), lambda: json.loads(big), few),
    ]  # fmt: skip
    print(f"{'depth check of':<34}{'check':>12}{'json.loads':>14}{'check/loads':>13}")
    for label, check, baseline, times in rows:
        checked, loaded = median_us(check, times), median_us(baseline, times)
        print(f"  {label:<32}{checked:12.1f}{loaded:14.1f}{checked / loaded:13.2f}")

    print("a reply through the bridge: encode + depth check, against encode alone (as before the cap)")
    for label, value in (("small dict", {"n": 1, "ok": True}), ("load_orders (500 rows)", orders)):
        reply = median_us(lambda v=value: _value_reply("t", 1, v), n)  # type: ignore[misc]
        encode = median_us(lambda v=value: _encode({"id": 1, "ok": True, "value": v}), n)  # type: ignore[misc]
        print(f"  {label:<32}{reply:12.1f} µs   encode alone {encode:10.1f} µs   ratio {reply / encode:5.2f}")

    patterns.install()
    zip_code = "^[0-9]{5}$"
    re2_us = median_us(lambda: patterns.search(zip_code, "12345"), n)
    re_us = median_us(lambda: re.search(zip_code, "12345"), n)
    print(f"pattern {zip_code!r} on '12345': RE2 {re2_us:.2f} µs, re {re_us:.2f} µs")
    evil_us = median_us(lambda: patterns.search("^(a+)+$", "a" * 30 + "b"), n)
    print(
        f"pattern '^(a+)+$' on 30 a's and a b: RE2 {evil_us:.2f} µs (re: 1.9 s at 26, doubling per character)"
    )

    objects = [{"id": i} for i in range(1000)]
    one_pass = median_us(lambda: patterns.unique(objects), few)
    pairwise = median_us(lambda: pairwise_unique(objects), max(1, few // 3))
    print(
        f"uniqueItems over 1,000 objects: one pass {one_pass / 1000:.2f} ms, pairwise {pairwise / 1000:.1f} ms"
    )


if __name__ == "__main__":
    main()
