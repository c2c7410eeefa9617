"""The ``sandfleet`` command. Subcommands load lazily, so producer commands never import worker code
(and an install without the worker extra still runs them)."""

from __future__ import annotations

import importlib
import importlib.util
import logging
import sys

import click

WORKER_EXTRA = ("docker", "openai", "psutil", "mcp", "mcp_types", "jsonschema", "httpx2")  # what `pip install 'sandfleet[worker]'` adds

# name -> "module:attribute"; the module is imported only when the command runs or shows help.
COMMANDS = {
    # producer side
    "submit": "sandfleet.producer.cli.jobs:submit",
    "batch": "sandfleet.producer.cli.jobs:batch",
    "result": "sandfleet.producer.cli.jobs:result",
    "audit": "sandfleet.producer.cli.audit:audit",
    "keys": "sandfleet.producer.cli.keys:keys",
    "jobs": "sandfleet.producer.cli.jobs:jobs",
    # worker side (needs the worker extra)
    "doctor": "sandfleet.worker.cli.doctor:doctor",
    "images": "sandfleet.worker.cli.images:images",
    "sandbox": "sandfleet.worker.cli.sandbox:sandbox",
    "run": "sandfleet.worker.cli.run:run",
    "tools": "sandfleet.worker.cli.tools:tools",
    "ask": "sandfleet.worker.cli.ask:ask",
    "compare": "sandfleet.worker.cli.compare:compare",
    "model-server": "sandfleet.worker.cli.model_server:model_server",
    "worker": "sandfleet.worker.cli.fleet:worker",
    "flower": "sandfleet.worker.cli.flower:flower",
    "replay": "sandfleet.worker.cli.replay:replay",
    "demo": "sandfleet.fleet.demo:demo",
    "loadtest": "sandfleet.fleet.loadtest.cli:loadtest",
}


class LazyGroup(click.Group):
    """A click group whose commands are imported on first use."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(name for name in COMMANDS if _importable(COMMANDS[name]))

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        target = COMMANDS.get(cmd_name)
        if target is None:
            return None
        module_name, attr = target.split(":")
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as e:
            if e.name and e.name.split(".")[0] in WORKER_EXTRA:
                raise click.ClickException(
                    f"`sandfleet {cmd_name}` needs the worker part. Install it with: pip install 'sandfleet[worker]'"
                ) from e
            raise
        command: click.Command = getattr(module, attr)
        return command


def _importable(target: str) -> bool:
    """Whether a command's module is installed (worker commands are absent from a producer-only install)."""
    try:
        return importlib.util.find_spec(target.split(":")[0]) is not None
    except ModuleNotFoundError:
        return False


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.option("-v", "--verbose", count=True, help="More logging (-v info, -vv debug).")
def main(verbose: int) -> None:
    """Sandfleet: run LLM-written code-action jobs in locked-down, single-use sandboxes."""
    level = {0: logging.WARNING, 1: logging.INFO}.get(verbose, logging.DEBUG)
    logging.basicConfig(
        level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr
    )


if __name__ == "__main__":  # pragma: no cover
    main()
