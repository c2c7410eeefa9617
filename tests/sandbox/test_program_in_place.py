"""A Python program run in a fork of the agent behaves exactly as ``python3 -s program.py`` does.

Each probe program runs twice in fresh sandboxes, once by exec of a new interpreter and once in
place (ExecResult.forked), under runc and runsc; exit code, stdout, stderr and what it left on disk
must be identical. The probes cover what Python sets up per script and does when a script ends.
"""

from __future__ import annotations

from typing import Any

import pytest

from sandfleet.core.config import SandboxConfig
from sandfleet.worker.sandbox.backends import backend_named

from .helpers import TEST_LABELS

SCRIPT = "/workspace/job/program.py"
ARGV = ["python3", "-s", SCRIPT]

PROBES = {
    "interpreter": """
import sys, os
print(sys.argv, sys.path, sys.flags, sys.executable, os.getcwd())
print(__name__, __file__, type(__loader__).__name__, __spec__, __package__, __cached__)
print(sys.modules["__main__"] is sys.modules[__name__], sorted(sys.modules))
print(sys.stdout.encoding, sys.stdout.errors, sys.stdout.line_buffering, sys.stderr.errors,
      sys.stderr.line_buffering, sys.stdin.encoding, sys.dont_write_bytecode)
print(sorted(os.environ.items()), repr(sys.stdin.read()))
print("RESULT: 1")
""",
    "finalization": """
import atexit, threading, time
atexit.register(lambda: print("atexit ran"))
left_open = open("/tmp/unclosed.txt", "w")
left_open.write("flushed when the interpreter finalizes")
threading.Thread(target=lambda: (time.sleep(0.2), print("thread joined"))).start()
print("main done")
""",
    "chained_exception": """
def f():
    raise ValueError("boom")
try:
    f()
except ValueError as e:
    raise KeyError("k") from e
""",
    "syntax_error": 'print("a"\n',
    "null_byte": 'print("before")\n\x00\n',
    "exit_message": 'import sys\nprint("x")\nsys.exit("bye")\n',
    "exit_code": "import sys\nsys.exit(3)\n",
    "os_exit": 'import os\nprint("lost in the buffer")\nos._exit(5)\n',
    "thread_exception": """
import threading
t = threading.Thread(target=lambda: 1 / 0)
t.start(); t.join()
print("after")
""",
    "warning_and_import_error": 'import warnings\nwarnings.warn("careful")\nimport no_such_module\n',
    "pickle_and_inspect": """
import inspect, pickle
class A: pass
print(len(pickle.dumps(A())) > 0, inspect.getsource(A).strip())
""",
}


def run_both_ways(config: SandboxConfig, program: str) -> list[tuple[Any, ...]]:
    outcomes = []
    for in_place in (False, True):
        sandbox = backend_named().start(config, labels=TEST_LABELS)
        try:
            sandbox.write_file(SCRIPT, program.encode())
            done = sandbox.execute(
                ARGV, timeout=30, stdin=b"some input", python_script=SCRIPT if in_place else None
            )
            assert done.forked is in_place
            left = sandbox.execute(["cat", "/tmp/unclosed.txt"], timeout=10).stdout
            outcomes.append((done.exit_code, done.stdout, done.stderr, left))
        finally:
            sandbox.destroy()
    return outcomes


@pytest.mark.parametrize("probe", sorted(PROBES))
def test_a_program_in_place_behaves_as_a_new_interpreter(backend: str, probe: str) -> None:
    by_exec, in_place = run_both_ways(SandboxConfig(backend=backend), PROBES[probe])
    assert in_place == by_exec


def test_an_uncaught_exception_shows_only_the_programs_frames(backend: str) -> None:
    _, (code, _, stderr, _) = run_both_ways(SandboxConfig(backend=backend), PROBES["chained_exception"])
    assert code == 1
    assert "sandfleet-agent" not in stderr and stderr.count(f'File "{SCRIPT}"') == 3


@pytest.mark.parametrize(
    "env", [{"PYTHONPATH": "/workspace/lib"}, {"PYTHONUNBUFFERED": "1"}, {"LANG": "C"}, {"PATH": "/bin"}]
)
def test_an_environment_that_changes_how_python_starts_gets_a_new_interpreter(
    docker_engine: object, env: dict[str, str]
) -> None:
    sandbox = backend_named().start(SandboxConfig(env=env), labels=TEST_LABELS)
    try:
        sandbox.write_file(SCRIPT, b"import os; print(os.environ.get('PYTHONPATH'))")
        done = sandbox.execute(ARGV, timeout=30, python_script=SCRIPT)
    finally:
        sandbox.destroy()
    assert done.exit_code == 0, done.stderr
    assert not done.forked


def test_other_variables_keep_the_program_in_place(docker_engine: object) -> None:
    sandbox = backend_named().start(
        SandboxConfig(env={"GREETING": "hi", "PYTHON_VERSION": "x"}), labels=TEST_LABELS
    )
    try:
        sandbox.write_file(SCRIPT, b"import os; print(os.environ['GREETING'])")
        done = sandbox.execute(ARGV, timeout=30, python_script=SCRIPT)
    finally:
        sandbox.destroy()
    assert (done.forked, done.stdout) == (True, "hi\n")
