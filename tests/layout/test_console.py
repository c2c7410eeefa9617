"""Everything the commands print goes through sandfleet/core/console.py, which escapes it for the
terminal (sandfleet/core/terminal_text.py). Read from the source with ``ast``: a ``click.echo``,
``print`` or ``sys.stdout.write`` anywhere else in the package is a place where a program's,
model's, submitter's or server's text could reach a person's screen raw."""

from __future__ import annotations

import ast
from pathlib import Path

from .imports import PACKAGE_DIR, module_files

# Modules that write to a stdout which is not a person's terminal: Squid's external ACL helper speaks
# Squid's protocol over it, and squid.py prints a config file when run as a script; the isolation probe
# prints its report inside a container, to the log docker/probe.py reads back.
NOT_A_TERMINAL = {
    "sandfleet.worker.egress.helper",
    "sandfleet.worker.egress.squid",
    "sandfleet.worker.sandbox.inside.isolation_probe",
}
CONSOLE = "sandfleet.core.console"
DIRECT_OUTPUT = {("click", "echo"), ("click", "secho"), ("click", "echo_via_pager")}


def direct_output_calls(path: Path) -> list[str]:
    """``line: call`` of every print, click.echo/secho and sys.stdout/stderr write in ``path``."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        text = ast.unparse(func)
        if isinstance(func, ast.Name) and func.id == "print":
            found.append(f"{node.lineno}: {text}")
        elif isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name):
            if (func.value.id, func.attr) in DIRECT_OUTPUT:
                found.append(f"{node.lineno}: {text}")
        if text.startswith(("sys.stdout.", "sys.stderr.")) and text.endswith(".write"):
            found.append(f"{node.lineno}: {text}")
    return found


def test_only_the_console_module_prints() -> None:
    offenders = {
        name: calls
        for name, path in module_files().items()
        if name not in NOT_A_TERMINAL and name != CONSOLE and (calls := direct_output_calls(path))
    }
    assert offenders == {}, "print through sandfleet.core.console (echo, echo_json) instead"


def test_the_exceptions_still_print_and_the_console_does() -> None:
    """The allow-list names modules that really print (it cannot rot into hiding nothing)."""
    files = module_files()
    assert [name for name in sorted(NOT_A_TERMINAL | {CONSOLE}) if not direct_output_calls(files[name])] == []
    assert (PACKAGE_DIR / "core" / "console.py").exists()


def test_the_finder_sees_each_kind_of_call(tmp_path: Path) -> None:
    source = tmp_path / "m.py"
    source.write_text(
        "import click, sys\nprint(1)\nclick.echo('x')\nclick.secho('y')\nsys.stdout.write('z')\n"
        "sys.stderr.buffer.write(b'w')\n'print(2) in a string is not a call'\n"
    )
    assert [c.split(":")[0] for c in direct_output_calls(source)] == ["2", "3", "4", "5", "6"]
