"""Tool-call round trip through the bridge, beside a file-polling bridge, in one run.

    .venv/bin/python benchmarks/bridge_roundtrip.py [--calls 1000] [--poll-calls 50] [--runtimes runc,runsc]

Prints, per runtime:
  1. a small call (one int argument, small dict back), timed inside the program with perf_counter
     around each call: median and p95 over ``--calls`` calls (after a warm-up);
  2. the reference scenario's ``load_orders()`` (500 rows) round trip, median over ``--orders-calls``;
  3. the same small call over a simple file-polling bridge: the program writes a request file in
     /workspace and waits for the response file; the host polls every 30 ms through ``docker exec``
     (one exec per poll, which also delivers pending responses), ``--poll-calls`` calls;
and the ratio of (3) to (1). Figures only: timings drift between runs and hosts, ratios measured
side by side are what to compare.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import RUNTIMES, engine_runtimes, fmt, labelled_pool, summary_ms

POLL_INTERVAL_S = 0.030
WARMUP_CALLS = 50


def ping(n: int) -> dict:
    """A small dict back for one int: the smallest useful tool call."""
    return {"n": n, "ok": True}


TIMED_PROGRAM = """\
import json, time
from sandfleet_tools import {tool}
for i in range({warmup}):
    {call}
samples = []
for i in range({calls}):
    began = time.perf_counter()
    value = {call}
    samples.append(time.perf_counter() - began)
{check}
print("RESULT: " + json.dumps(samples))
"""

# The polling baseline's program: request file -> wait (polling the file system every 1 ms) -> response.
POLLING_PROGRAM = """\
import json, os, time
def call(i, n):
    tmp, path, answer = f"/workspace/req-{{i}}.tmp", f"/workspace/req-{{i}}.json", f"/workspace/resp-{{i}}.json"
    with open(tmp, "w") as f:
        json.dump({{"tool": "ping", "args": [n]}}, f)
    os.rename(tmp, path)
    while not os.path.exists(answer):
        time.sleep(0.001)
    with open(answer) as f:
        value = json.load(f)
    os.remove(answer)
    return value
samples = []
for i in range({calls}):
    began = time.perf_counter()
    value = call(i, i)
    samples.append(time.perf_counter() - began)
    assert value == {{"n": i, "ok": True}}, value
with open("/workspace/samples.tmp", "w") as f:
    json.dump(samples, f)
os.rename("/workspace/samples.tmp", "/workspace/samples.json")
"""

# One docker exec per poll: write the responses the host computed (argv[1]), then report new requests
# (and the samples file once the program is done).
POLL_STEP = """\
import json, os, sys
for name, value in json.loads(sys.argv[1]).items():
    with open("/workspace/" + name + ".tmp", "w") as f:
        json.dump(value, f)
    os.rename("/workspace/" + name + ".tmp", "/workspace/" + name)
found = {}
for name in os.listdir("/workspace"):
    if name.startswith("req-") and name.endswith(".json"):
        with open("/workspace/" + name) as f:
            found[name] = json.load(f)
        os.remove("/workspace/" + name)
done = None
if os.path.exists("/workspace/samples.json"):
    with open("/workspace/samples.json") as f:
        done = json.load(f)
print(json.dumps({"requests": found, "samples": done}))
"""


def bridge_samples(
    runtime: Any, backend: str, tool: str, call: str, calls: int, check: str = ""
) -> list[float]:
    from sandfleet.core.config import CodeActionSettings, SandboxConfig

    source = TIMED_PROGRAM.format(
        tool=tool, call=call, calls=calls, warmup=min(WARMUP_CALLS, calls), check=check
    )
    settings = CodeActionSettings(exec_timeout=600, max_tool_calls=calls + WARMUP_CALLS)
    run = runtime.run(source, config=SandboxConfig(backend=backend), settings=settings)
    if not run.ok:
        raise SystemExit(f"the timed program failed under {backend}: {run.failure()}\n{run.stderr[-2000:]}")
    return run.result


def polling_samples(pool: Any, backend: str, calls: int) -> list[float]:
    """The simple file-polling bridge: host polls /workspace through docker exec every 30 ms."""
    import docker

    from sandfleet.core.config import SandboxConfig

    client = docker.from_env()
    lease = pool.acquire(SandboxConfig(backend=backend))
    try:
        container = client.containers.get(lease.container.id)
        container.exec_run(["python3", "-c", POLLING_PROGRAM.format(calls=calls)], detach=True)
        pending: dict[str, Any] = {}
        deadline = time.monotonic() + 30 + calls * 2
        while time.monotonic() < deadline:
            time.sleep(POLL_INTERVAL_S)
            result = container.exec_run(["python3", "-c", POLL_STEP, json.dumps(pending)])
            if result.exit_code != 0:
                raise SystemExit(f"polling step failed: {result.output.decode(errors='replace')}")
            step = json.loads(result.output)
            pending = {}
            for name, request in step["requests"].items():
                pending["resp-" + name[len("req-") :]] = ping(*request["args"])  # the tool runs on the host
            if step["samples"] is not None:
                return step["samples"]
        raise SystemExit("the polling baseline did not finish in time")
    finally:
        pool.release(lease.container)
        client.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=1000)
    parser.add_argument("--orders-calls", type=int, default=50)
    parser.add_argument("--poll-calls", type=int, default=50)
    parser.add_argument("--runtimes", default="runc,runsc")
    args = parser.parse_args()

    from sandfleet.worker.program.runtime import ProgramRuntime
    from sandfleet.worker.tools.examples import orders
    from sandfleet.worker.tools.examples.scenario import write_reference_data
    from sandfleet.worker.tools.registry import ToolRegistry

    available = engine_runtimes()
    wanted = [r for r in args.runtimes.split(",") if r]
    data = tempfile.TemporaryDirectory(prefix="sandfleet-bench-")
    write_reference_data(data.name)
    os.environ["SANDFLEET_DATA_DIR"] = data.name  # where load_orders reads
    registry = ToolRegistry.from_functions([ping, orders.load_orders])
    figures: dict[str, dict[str, dict[str, float]]] = {}
    with labelled_pool("bridge_roundtrip", pool_size=1, max_live=3) as pool:
        runtime = ProgramRuntime(pool, registry)
        for name in wanted:
            if name not in available:
                print(f"{name}: not registered with the engine, skipped")
                continue
            backend = RUNTIMES[name]
            small = bridge_samples(
                runtime, backend, "ping", "ping(i)", args.calls, check='assert value == {"n": i, "ok": True}'
            )
            rows = bridge_samples(
                runtime,
                backend,
                "load_orders",
                "load_orders()",
                args.orders_calls,
                check="assert len(value) == 500",
            )
            poll = polling_samples(pool, backend, args.poll_calls)
            figures[name] = {"small": summary_ms(small), "rows": summary_ms(rows), "poll": summary_ms(poll)}
    data.cleanup()

    print(
        f"\nTool-call round trip, timed inside the program (perf_counter around each call); host {os.uname().nodename}"
    )
    for name, f in figures.items():
        ratio_median = f["poll"]["median"] / f["small"]["median"]
        ratio_p95 = f["poll"]["p95"] / f["small"]["p95"]
        print(f"\n[{name}]")
        print(f"  bridge, small call ping(int) -> dict   {fmt(f['small'])}")
        print(f"  bridge, load_orders() -> 500 rows      {fmt(f['rows'])}")
        print(f"  file polling via docker exec / 30 ms   {fmt(f['poll'])}")
        print(f"  polling / bridge: median {ratio_median:,.0f}x   p95 {ratio_p95:,.0f}x")
    if "runc" in figures:
        median = figures["runc"]["small"]["median"]
        print(
            f"\ntarget: runc small-call median < 0.5 ms -> {median:.3f} ms ({'met' if median < 0.5 else 'NOT met'})"
        )


if __name__ == "__main__":
    main()
