"""``sandfleet model-server``: the OpenAI-compatible replay server, in the foreground."""

from __future__ import annotations

import signal
import threading
from pathlib import Path
from types import FrameType

import click

from sandfleet.core.console import echo, echo_json
from sandfleet.core.errors import InvalidSpecError
from sandfleet.worker.llm.scripted.server import DEFAULT_HOST, ReplayServer

DEFAULT_PORT = 8400


@click.command("model-server")
@click.option(
    "--script",
    "script_path",
    required=True,
    type=click.Path(dir_okay=False, path_type=Path),
    help="Replay script (JSON or YAML): rules of regex -> responses, and a default.",
)
@click.option("--host", default=DEFAULT_HOST, show_default=True, help="Address to listen on.")
@click.option(
    "--port",
    default=DEFAULT_PORT,
    show_default=True,
    type=click.IntRange(0, 65535),
    help="0 picks a free port.",
)
@click.option(
    "--latency",
    "latency_s",
    default=0.0,
    show_default=True,
    type=click.FloatRange(min=0),
    help="Seconds every reply waits, unless its rule or response sets its own.",
)
@click.option("--json", "as_json", is_flag=True, help='Print {"base_url": ...} instead of the bare URL.')
def model_server(script_path: Path, host: str, port: int, latency_s: float, as_json: bool) -> None:
    """Serve POST /v1/chat/completions and GET /v1/models from a replay script until interrupted.

    Prints the base URL to give an OpenAI client (OPENAI_BASE_URL) as its first line of output.
    """
    try:
        server = ReplayServer.from_file(script_path, host=host, port=port, latency_s=latency_s)
        base_url = server.start()
    except InvalidSpecError as e:
        raise click.ClickException(str(e)) from e
    except OSError as e:
        raise click.ClickException(f"cannot listen on {host}:{port}: {e.strerror or e}") from e
    stopping = threading.Event()

    def on_terminate(signum: int, frame: FrameType | None) -> None:
        stopping.set()

    signal.signal(signal.SIGTERM, on_terminate)  # before the URL: a caller may stop it once it reads it
    if as_json:
        echo_json({"base_url": base_url})
    else:
        echo(base_url)
    try:
        stopping.wait()
    except KeyboardInterrupt:
        pass
    finally:
        server.stop()
