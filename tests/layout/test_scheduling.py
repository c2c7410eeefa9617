"""The Docker-bound tests' scheduling (tests/sandfleet_testing/scheduling.py), through real pytest-xdist
runs of a small generated suite: the longest recorded scope goes first whatever the collection order,
and the benchmark smoke module is split by test while other modules stay whole in one process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from sandfleet_testing.scheduling import durations_from_junit, scope_of

TESTS = Path(__file__).resolve().parents[1]

RECORDING_TEST = """
import os, time
def test_{name}():
    with open({log!r}, "a") as log:
        log.write(f"{module} {{os.environ['PYTEST_XDIST_WORKER']}} {{time.monotonic()}}\\n")
"""

CONFTEST = """
def pytest_xdist_make_scheduler(config, log):
    from sandfleet_testing.scheduling import LongestFirstScheduling
    return LongestFirstScheduling(config, log, durations={durations!r})
"""


def run_suite(root: Path, modules: dict[str, int], durations: dict[str, float], processes: int) -> list[str]:
    """Write ``modules`` (path: number of tests), run them under loadscope; the log's lines in order."""
    log = root / "ran.log"
    for module, count in modules.items():
        path = root / module
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(
            "".join(RECORDING_TEST.format(name=i, log=str(log), module=module) for i in range(count))
        )
    (root / "conftest.py").write_text(CONFTEST.format(durations=durations))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "-n",
            str(processes),
            "--dist",
            "loadscope",
        ],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    return sorted(log.read_text().splitlines(), key=lambda line: float(line.split()[2]))


def test_the_longest_recorded_scope_runs_first_whatever_the_collection_order(tmp_path: Path) -> None:
    modules = {"test_a.py": 2, "test_b.py": 2, "test_z_long.py": 1}
    ran = run_suite(tmp_path, modules, {"test_a.py": 1.0, "test_b.py": 2.0, "test_z_long.py": 500.0}, 1)
    assert [line.split()[0] for line in ran] == [
        "test_z_long.py",
        "test_b.py",
        "test_b.py",
        "test_a.py",
        "test_a.py",
    ]


def test_the_smoke_module_is_split_by_test_and_other_modules_stay_whole(tmp_path: Path) -> None:
    smoke = "tests/loadtest/test_benchmarks_smoke.py"
    ran = run_suite(tmp_path, {smoke: 2, "tests/test_whole.py": 4}, {}, 3)  # one unit per process first
    workers = {
        module: {line.split()[1] for line in ran if line.startswith(module)}
        for module in (smoke, "tests/test_whole.py")
    }
    assert len(workers[smoke]) == 2 and len(workers["tests/test_whole.py"]) == 1, ran


def test_scopes_and_durations_are_read_from_node_ids_and_junit(tmp_path: Path) -> None:
    assert scope_of("tests/fleet/test_x.py::test_y[runc]") == "tests/fleet/test_x.py"
    assert scope_of("tests/fleet/test_x.py::TestY::test_z") == "tests/fleet/test_x.py::TestY"
    smoke_test = "tests/loadtest/test_benchmarks_smoke.py::test_benchmark_runs_and_prints_its_figures[burst]"
    assert scope_of(smoke_test) == smoke_test
    junit = tmp_path / "junit.xml"
    junit.write_text(
        "<testsuites><testsuite>"
        '<testcase classname="tests.layout.test_scheduling" name="test_a" time="1.5"/>'
        '<testcase classname="tests.layout.test_scheduling" name="test_b[x]" time="2.0"/>'
        '<testcase classname="tests.loadtest.test_benchmarks_smoke" '
        'name="test_benchmark_runs_and_prints_its_figures[burst]" time="30"/>'
        "</testsuite></testsuites>"
    )
    assert durations_from_junit(junit) == {"tests/layout/test_scheduling.py": 3.5, smoke_test: 30.0}


def test_the_checked_in_record_names_scopes_that_exist() -> None:
    """A renamed module would silently lose its place in the order: the record must follow renames."""
    record = json.loads((TESTS / "sandfleet_testing" / "scope_durations.json").read_text())
    missing = sorted(s for s in record if not (TESTS.parent / s.split("::", 1)[0]).is_file())
    assert not missing, f"refresh scope_durations.json (see scheduling.py): {missing}"
