"""The ``sandfleet`` command. Subcommands load lazily, so producer commands never import worker code
(and an install without the worker extra still runs them), and ``sandfleet --help`` imports none of
them: each command's one-line help is kept here (tests/fleet/test_cli.py checks it matches)."""

from __future__ import annotations

import importlib
import importlib.util
import sys

import click

# What `pip install 'sandfleet[worker]'` adds.
WORKER_EXTRA = ("docker", "openai", "psutil", "mcp", "mcp_types", "jsonschema", "httpx2")

# name -> ("module:attribute", its one-line help); the module is imported only when the command runs
# or shows its own help.
COMMANDS = {
    # producer side
    "submit": (
        "sandfleet.producer.cli.jobs:submit",
        "Submit QUESTION to the fleet; print the job id, or with --wait the RESULT payload.",
    ),
    "batch": (
        "sandfleet.producer.cli.jobs:batch",
        "Submit every row of FILE (JSONL: a JobSpec per line; CSV: a `question` column) as one batch.",
    ),
    "result": (
        "sandfleet.producer.cli.jobs:result",
        "Print the RESULT payload of a finished job, once its audit chain proves it.",
    ),
    "audit": (
        "sandfleet.producer.cli.audit:audit",
        "Print a job's audit events in order (model calls, programs, runs, tool calls, states), verify "
        "jobs and batches, or export and check audit bundles.",
    ),
    "keys": (
        "sandfleet.producer.cli.keys:keys",
        "Workers' public signing keys: list, export, rotate, revoke.",
    ),
    "approvers": (
        "sandfleet.producer.cli.approvers:approvers",
        "People whose signed decisions workers accept: keygen, add, list, revoke.",
    ),
    "jobs": ("sandfleet.producer.cli.jobs:jobs", "List jobs, newest first (a batch's in submission order)."),
    "approvals": (
        "sandfleet.producer.cli.approvals:approvals",
        "Approval requests of gated tool calls: list, show, approve, deny.",
    ),
    "artifacts": (
        "sandfleet.producer.cli.artifacts:artifacts",
        "List the files JOB's program wrote under /workspace/out/, or write them under --out DIR.",
    ),
    "cancel": (
        "sandfleet.producer.cli.cancel:cancel",
        "Cancel jobs: a queued job never starts, a running one has its sandbox killed; both end `cancelled`.",
    ),
    # worker side (needs the worker extra)
    "doctor": (
        "sandfleet.worker.cli.doctor:doctor",
        "Check the Docker engine, runtimes, images, Redis, the model endpoint and the MCP servers.",
    ),
    "images": (
        "sandfleet.worker.cli.images:images",
        "Sandbox images: build them from the distribution's packages.",
    ),
    "sandbox": (
        "sandfleet.worker.cli.sandbox:sandbox",
        "Run commands in fresh sandboxes, inspect them, remove leftovers.",
    ),
    "run": (
        "sandfleet.worker.cli.run:run",
        "Run PROGRAM in a fresh sandbox with the tool bridge, caps and the RESULT line; print the payload.",
    ),
    "tools": (
        "sandfleet.worker.cli.tools:tools",
        "List every tool a worker would offer: source, name, signature, description.",
    ),
    "ask": (
        "sandfleet.worker.cli.ask:ask",
        "Answer QUESTION (by default with one model-written program run in a fresh sandbox); print the "
        "RESULT payload.",
    ),
    "compare": (
        "sandfleet.worker.cli.compare:compare",
        "Answer QUESTION as a code-action job and as a chat job (the baseline); print them side by side.",
    ),
    "model-server": (
        "sandfleet.worker.cli.model_server:model_server",
        "Serve POST /v1/chat/completions and GET /v1/models from a replay script until interrupted.",
    ),
    "worker": (
        "sandfleet.worker.cli.worker:worker",
        "Start a worker: takes jobs from Redis, runs them in sandboxes, writes their records.",
    ),
    "flower": (
        "sandfleet.worker.cli.flower:flower",
        "Start Flower for the fleet (its broker is SANDFLEET_REDIS_URL).",
    ),
    "replay": (
        "sandfleet.worker.cli.replay:replay",
        "Re-run JOB's final program (or every job of --batch) in a fresh sandbox, tools answered from its "
        "audit record, and compare the RESULT with the one the record serves and the chain seals.",
    ),
    "demo": (
        "sandfleet.fleet.demo:demo",
        "Run the reference question (Q3 2026 revenue per region) through the fleet; exit 0 when the "
        "fleet's RESULT matches the plain-Python totals.",
    ),
    "fleet": (
        "sandfleet.fleet.fleet_cli:fleet",
        "Local multi-host fleets (network namespaces, engines, workers).",
    ),
    "loadtest": (
        "sandfleet.fleet.loadtest.cli:loadtest",
        "Drive the fleet with many jobs and report throughput and latency by phase.",
    ),
}


class LazyGroup(click.Group):
    """A click group whose commands are imported on first use, and not at all for the group's help."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(name for name in COMMANDS if _importable(COMMANDS[name][0]))

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        entry = COMMANDS.get(cmd_name)
        if entry is None:
            return None
        module_name, attr = entry[0].split(":")
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

    def invoke(self, ctx: click.Context) -> object:
        """Run the command; a ClickException it raises is shown with its message escaped (it may
        quote a job's input, a server's reply or a record from Redis: sandfleet/core/console.py)."""
        try:
            return super().invoke(ctx)
        except click.ClickException as e:
            from sandfleet.core.console import escaped_click_error

            escaped_click_error(e)
            raise

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        """The command list from COMMANDS, shortened as click shortens each command's own help."""
        names = self.list_commands(ctx)
        if not names:
            return
        limit = formatter.width - 6 - max(len(name) for name in names)
        # click's own shortening (its helper for it is deprecated): a command holding only the help
        rows = [
            (name, click.Command(name, help=COMMANDS[name][1]).get_short_help_str(limit)) for name in names
        ]
        with formatter.section("Commands"):
            formatter.write_dl(rows)


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
    import logging  # here, not at the top: `sandfleet --help` needs none of it

    from sandfleet.core.console import escaping_formatter

    level = {0: logging.WARNING, 1: logging.INFO}.get(verbose, logging.DEBUG)
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(escaping_formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    logging.basicConfig(level=level, handlers=[handler])


if __name__ == "__main__":  # pragma: no cover
    main()
