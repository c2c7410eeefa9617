"""Batches of many small program-and-test tasks through the fleet against raw SDK churn, side by side.

    .venv/bin/python benchmarks/small_tasks.py [--tasks 164] [--sizes 20,40,82,164] [--rounds 1]
        [--sandboxes 4] [--concurrency 16] [--pool-size 2]

Like a code-generation evaluation: ``--tasks`` generated tasks, each a program that defines a
function and runs its tests (``assert``s over a handful of inputs), printing ``RESULT: 1`` when all
pass. The model answers at once: a replay model server, in a process of its own, holds one rule per
task (the question names the task, the answer is its program).

Fleet: one local worker (``--sandboxes`` slots, ``--concurrency`` jobs in flight), each batch
submitted with ``submit_batch`` and awaited with ``BatchHandle.wait``: jobs/s from submit to the
last result read. Raw: the same programs by ``--sandboxes`` threads of Docker SDK
``containers.run(remove=True)`` with the sandbox's hardening and ``network_disabled=True``
(sandfleet/fleet/loadtest/churn.py ``churn_kwargs``). For each batch size, the two run back to back
in an order rotated per size and round, so the host's drift favours neither. Printed: jobs/s of
each, the ratio (target >= 1.5, issue 25 point 5) per size, and the overall ratio. Figures only.
"""

from __future__ import annotations

import argparse
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import model_server, served_model_env

TARGET = 1.5
# Function families: (name, body, test inputs, the reference used to compute expected values).
FAMILIES: list[tuple[str, str, list[Any]]] = [
    ("add_k", "return x + {k}", list(range(6))),
    ("scaled_square", "return {k} * x * x", list(range(6))),
    ("digit_sum", "return sum(int(c) for c in str(abs(x) * {k}))", [0, 7, 19, 123, 4096, 99999]),
    ("count_multiples", "return sum(1 for n in range(x + 1) if n % {k} == 0)", [0, 5, 10, 17, 30]),
    ("reverse_words", "return ' '.join(reversed(x.split()))[:{k} + 40]", ["a b c", "one two", "x"]),
    (
        "fib_mod",
        "a, b = 0, 1\n    for _ in range(x):\n        a, b = b, a + b\n    return a % ({k} + 7)",
        [0, 1, 5, 10, 20],
    ),
    (
        "is_prime_shift",
        "n = x + {k}\n    return n > 1 and all(n % d for d in range(2, int(n ** 0.5) + 1))",
        [0, 1, 2, 10, 20],
    ),
    ("vowels_plus", "return sum(c in 'aeiou' for c in x) + {k}", ["", "sandbox", "evaluation", "queue"]),
]


def task_program(number: int) -> str:
    """The ``number``-th task's program: a function, its tests against expected values worked out
    here (literals in the program, as an evaluation's tests are), and ``RESULT: 1`` when all pass."""
    name, body, inputs = FAMILIES[number % len(FAMILIES)]
    function = f"def {name}_{number}(x):\n    {body.format(k=number // len(FAMILIES) + 1)}\n"
    scope: dict[str, Any] = {}
    exec(function, scope)  # our own generated source: the expected values
    cases = [(x, scope[f"{name}_{number}"](x)) for x in inputs]
    return (
        f"{function}\n\n"
        f"CASES = {cases!r}\n"
        "passed = 0\n"
        "for x, want in CASES:\n"
        f"    got = {name}_{number}(x)\n"
        "    assert got == want, (x, got, want)\n"
        "    passed += 1\n"
        'print("RESULT:", 1 if passed == len(CASES) else 0)\n'
    )


def question(number: int) -> str:
    return f"task {number:03d}: write the function and run its tests"


def replay_rules(tasks: int) -> dict[str, Any]:
    """One rule per task: its question's tag -> its program (the programs are valid Python of ours)."""
    rules = [
        {"match": f"task {n:03d}:", "responses": [f"```python\n{task_program(n)}```"]} for n in range(tasks)
    ]
    return {"rules": rules}


def fleet_batch(fleet: Any, numbers: list[int]) -> float:
    """Jobs/s of one batch of these tasks, from submit to every result read (all must pass)."""
    began = time.monotonic()
    with fleet.client() as client:
        batch = client.submit_batch([question(n) for n in numbers], model="openai:replay", tools=[])
        results = batch.wait(timeout=120 + 3 * len(numbers))
    wall = time.monotonic() - began
    bad = [r for r in results if r.status != "succeeded" or str(r.result) != "1"]
    if bad or len(results) != len(numbers):
        raise SystemExit(f"{len(bad)} of {len(numbers)} fleet jobs failed: {bad[:1]}")
    return len(numbers) / wall


def raw_churn(numbers: list[int], threads: int) -> float:
    """Jobs/s of ``containers.run(remove=True)`` of each task's program, ``threads`` at a time."""
    from sandfleet.core.config import SandboxConfig
    from sandfleet.fleet.loadtest.churn import churn_kwargs, remove_bench_containers, run_concurrently
    from sandfleet.worker.sandbox.docker import backend as engine

    client = engine.docker_client()
    ncpu = engine.engine_info(client).ncpu
    label = uuid.uuid4().hex[:12]
    todo, lock, failures = list(numbers), threading.Lock(), [0]

    def one() -> None:
        with lock:
            number = todo.pop()
        kwargs = churn_kwargs(SandboxConfig(), label, ncpu, task_program(number), "disabled")
        try:
            ok = b"RESULT: 1" in client.containers.run(**kwargs)
        except Exception:
            ok = False
        if not ok:
            with lock:
                failures[0] += 1

    began = time.monotonic()
    try:
        run_concurrently(len(numbers), threads, one)
    finally:
        wall = time.monotonic() - began
        remove_bench_containers(client, label)
    if failures[0]:
        raise SystemExit(f"{failures[0]} of {len(numbers)} raw runs failed")
    return len(numbers) / wall


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--tasks", type=int, default=164, help="generated tasks")
    parser.add_argument("--sizes", default="20,40,82,164", help="batch sizes (first tasks of the set)")
    parser.add_argument("--rounds", type=int, default=1, help="runs of every size, each way")
    parser.add_argument("--sandboxes", type=int, default=4, help="worker slots = raw churn threads")
    parser.add_argument("--concurrency", type=int, default=16, help="worker jobs in flight")
    parser.add_argument("--pool-size", type=int, default=2, help="the worker's SANDFLEET_POOL_SIZE")
    parser.add_argument("--worker-env", action="append", default=[], help="NAME=VALUE for the worker")
    args = parser.parse_args()
    sizes = [min(int(s), args.tasks) for s in args.sizes.split(",")]

    from sandfleet.fleet.local import FleetConfig, LocalFleet

    with model_server(replay_rules(args.tasks)) as (base_url, _pid):
        env = {**served_model_env(base_url), "SANDFLEET_POOL_SIZE": str(args.pool_size)}
        env.update(dict(kv.split("=", 1) for kv in args.worker_env))
        config = FleetConfig(
            workers=1, concurrency=args.concurrency, sandboxes=args.sandboxes, tools="", env=env
        )
        with LocalFleet(config) as fleet:
            fleet_batch(fleet, list(range(min(args.sandboxes, args.tasks))))  # warm-up: imports, pool
            raw_churn(list(range(min(args.sandboxes, args.tasks))), args.sandboxes)
            print(
                f"{args.tasks} generated tasks; fleet: 1 worker, {args.sandboxes} slots, "
                f"{args.concurrency} in flight, pool_size {args.pool_size}; raw: {args.sandboxes} threads"
            )
            totals = {"fleet": [0, 0.0], "raw": [0, 0.0]}
            turn = 0
            for number in range(args.rounds):
                for size in sizes:
                    numbers = list(range(size))
                    rates: dict[str, float] = {}
                    for what in ("fleet", "raw") if turn % 2 == 0 else ("raw", "fleet"):
                        rate = (
                            fleet_batch(fleet, numbers)
                            if what == "fleet"
                            else raw_churn(numbers, args.sandboxes)
                        )
                        rates[what] = rate
                        totals[what][0] += size
                        totals[what][1] += size / rate
                    turn += 1
                    print(
                        f"  round {number + 1}, batch of {size:>3}: fleet {rates['fleet']:.2f} jobs/s, "
                        f"raw {rates['raw']:.2f} jobs/s, fleet/raw {rates['fleet'] / rates['raw']:.2f}"
                    )
    fleet_rate = totals["fleet"][0] / totals["fleet"][1]
    raw_rate = totals["raw"][0] / totals["raw"][1]
    verdict = "meets" if fleet_rate / raw_rate >= TARGET else "below"
    print(
        f"overall: fleet {fleet_rate:.2f} jobs/s, raw {raw_rate:.2f} jobs/s, "
        f"fleet/raw {fleet_rate / raw_rate:.2f} ({verdict} the {TARGET} target)"
    )


if __name__ == "__main__":
    main()
