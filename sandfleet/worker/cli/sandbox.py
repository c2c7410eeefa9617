"""``sandfleet sandbox run|inspect|prune``: one command in one fresh sandbox, and what Docker made."""

from __future__ import annotations

import sys

import click

from sandfleet.core.console import echo, echo_json
from sandfleet.core.errors import SandfleetError
from sandfleet.core.options import sandbox_config_from, sandbox_option
from sandfleet.worker.cli.common import loading_then_frozen, local_engine


@click.group()
def sandbox() -> None:
    """Run commands in fresh sandboxes, inspect them, remove leftovers."""


@sandbox.command(context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False})
@sandbox_option
@click.option(
    "--timeout",
    type=float,
    default=None,
    help="Seconds before the command is killed (default: the sandbox timeout).",
)
@click.option("--json", "as_json", is_flag=True, help="Print {stdout, stderr, exit_code, timed_out} as JSON.")
@click.argument("cmd", nargs=-1, required=True, type=click.UNPROCESSED)
def run(options: tuple[str, ...], timeout: float | None, as_json: bool, cmd: tuple[str, ...]) -> None:
    """Run CMD in one fresh sandbox; print its output and exit with its exit code.

    Example: sandfleet sandbox run -o memory_limit=512M -- python3 -c 'print(1)'
    """
    with loading_then_frozen():
        engine = local_engine()
        from sandfleet.worker.sandbox.backends import backend_named
        from sandfleet.worker.sandbox.manager import SandboxManager

        config = sandbox_config_from(options)
    try:
        with SandboxManager(config, backend=backend_named(thin=engine)) as manager:
            result = manager.create_session().execute(list(cmd), timeout=timeout)
    except SandfleetError as e:
        raise click.ClickException(str(e)) from None
    if as_json:
        echo_json(result.to_dict())
    else:  # the command's output, escaped as every command's (its exact bytes: --json)
        echo(result.stdout, nl=False)
        echo(result.stderr, err=True, nl=False)
        if result.stdout_truncated or result.stderr_truncated:
            echo(
                f"[output truncated: {result.stdout_bytes} bytes of stdout, {result.stderr_bytes} of stderr]",
                err=True,
            )
        echo(f"[exit code {result.exit_code}{', timed out' if result.timed_out else ''}]", err=True)
    sys.exit(result.exit_code if 0 <= result.exit_code < 256 else 1)


@sandbox.command()
@sandbox_option
@click.option("--json", "as_json", is_flag=True, help="Print JSON (the default is also JSON, indented).")
def inspect(options: tuple[str, ...], as_json: bool) -> None:
    """Start a sandbox and print how Docker really configured it, who runs inside, and the network
    it sees from inside (Docker's NetworkMode alone says "default" for a disabled network)."""
    from sandfleet.worker.sandbox.isolation import describe_network
    from sandfleet.worker.sandbox.manager import SandboxManager

    config = sandbox_config_from(options)
    try:
        with SandboxManager(config) as manager:
            session = manager.create_session()
            attrs = session.inspect()
            ids = session.execute(
                ["python3", "-c", "import os; print(os.geteuid(), os.getegid())"], timeout=30
            )
            network = describe_network(config, session.hello.get("network"), attrs)
            resolv = session.read_file("/etc/resolv.conf").decode(errors="replace")
    except SandfleetError as e:
        raise click.ClickException(str(e)) from None
    network["Nameservers"] = [
        line.split()[1] for line in resolv.splitlines() if line.startswith("nameserver ")
    ]
    host = attrs["HostConfig"]
    report = {
        "Id": attrs["Id"],
        "Image": attrs["Config"]["Image"],
        "Network": network,
        "ReadonlyRootfs": host.get("ReadonlyRootfs"),
        "NanoCpus": host.get("NanoCpus"),
        "Memory": host.get("Memory"),
        "MemorySwap": host.get("MemorySwap"),
        "PidsLimit": host.get("PidsLimit"),
        "SecurityOpt": host.get("SecurityOpt"),
        "Tmpfs": host.get("Tmpfs"),
        "CapDrop": host.get("CapDrop"),
        "CapAdd": host.get("CapAdd"),
        "Runtime": host.get("Runtime"),
        "Init": host.get("Init"),
        "Ulimits": host.get("Ulimits"),
        "User": attrs["Config"].get("User"),
        "Env": attrs["Config"].get("Env"),
        "Labels": attrs["Config"].get("Labels"),
        "EffectiveUid": int(ids.stdout.split()[0]) if ids.exit_code == 0 else None,
        "EffectiveGid": int(ids.stdout.split()[1]) if ids.exit_code == 0 else None,
    }
    echo_json(report, indent=None if as_json else 2)


@sandbox.command()
@click.option("--all", "everything", is_flag=True, help="Remove every Sandfleet container, live owners' too.")
@click.option("--json", "as_json", is_flag=True)
def prune(everything: bool, as_json: bool) -> None:
    """Remove Sandfleet containers whose owner process is gone (and orphaned gVisor processes)."""
    from sandfleet.worker.sandbox.docker.reaper import prune as prune_containers

    try:
        report = prune_containers(everything=everything)
    except SandfleetError as e:
        raise click.ClickException(str(e)) from None
    if as_json:
        echo_json(
            {"removed": report.removed, "kept": report.kept, "killed_processes": report.killed_processes}
        )
    else:
        echo(
            f"removed {len(report.removed)} container(s), kept {len(report.kept)}, "
            f"killed {len(report.killed_processes)} orphaned runtime process(es)"
        )
