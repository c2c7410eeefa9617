"""``sandfleet flower``: Flower for the fleet's broker, with basic auth whenever it listens beyond localhost.

Flower learns about tasks from Celery events as they happen (it keeps them in memory), so start it
before the jobs you want to see. The tasks page shows each task's id (the job id) and its arguments,
which the producer sends as ``argsrepr`` = ``[mode, start of the question]``.

The options Flower is started with are decided here, in pure functions (:func:`check_exposure`,
:func:`flower_argv`), and passed explicitly, so an address or a missing password cannot slip in from
Flower's own ``FLOWER_*`` variables or a ``flowerconfig.py`` in the working directory.
"""

from __future__ import annotations

import ipaddress

import click

from sandfleet.core.console import echo
from sandfleet.core.queue import redact_url
from sandfleet.core.settings import Settings, get_settings

DEFAULT_PORT = 5555
DEFAULT_ADDRESS = "127.0.0.1"
AUTH_ENVVAR = "SANDFLEET_FLOWER_AUTH"
# The tasks page: the job id (uuid) and the arguments (mode, start of the question) come first.
# Then the job's own outcome: state FAILURE for every job that did not succeed (sandfleet/worker/delivery/flower_report.py),
# the result column (status, RESULT preview, error) and the exception (status, error kind and message).
TASKS_COLUMNS = "name,uuid,state,args,result,exception,received,started,runtime,worker"
LOOPBACK_NAMES = ("localhost", "ip6-localhost", "ip6-loopback")


def is_loopback(address: str) -> bool:
    """Whether ``address`` only accepts connections from this host ("" and 0.0.0.0 listen everywhere)."""
    host = address.strip().strip("[]").lower()
    if host in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # a host name other than localhost may resolve to anything


def parse_basic_auth(value: str) -> list[str]:
    """``user:pass[,user2:pass2]`` as a list of ``user:pass``; ValueError naming what is wrong.

    The password itself never appears in a message.
    """
    pairs = [part.strip() for part in value.split(",") if part.strip()]
    if not pairs:
        raise ValueError("basic auth must be USER:PASS")
    for pair in pairs:
        user, sep, password = pair.partition(":")
        if not sep or not user or not password:
            raise ValueError(
                f"basic auth must be USER:PASS with both parts non-empty (got {user or '?'}:"
                f"{'***' if password else ''})"
            )
    return pairs


def check_exposure(address: str, basic_auth: str | None) -> list[str]:
    """The basic-auth pairs to start Flower with; ValueError when listening beyond localhost without any."""
    if basic_auth:
        return parse_basic_auth(basic_auth)
    if is_loopback(address):
        return []
    where = address or "every interface"
    raise ValueError(
        f"refusing to start Flower on {where} without a password: anyone who reaches the port could "
        f"read every job's question and stop workers. Pass --basic-auth USER:PASS (or set {AUTH_ENVVAR}), "
        f"or listen on 127.0.0.1"
    )


def flower_argv(port: int, address: str, auth_pairs: list[str], *, read_only: bool = False) -> list[str]:
    """The ``celery flower`` arguments (after the ``flower`` word)."""
    argv = [f"--port={port}", f"--address={address}", f"--tasks_columns={TASKS_COLUMNS}"]
    if auth_pairs:
        argv.append(f"--basic_auth={','.join(auth_pairs)}")
    if read_only:
        argv.append("--read_only=True")
    return argv


def flower_url(address: str, port: int) -> str:
    """Where to point a browser: the address itself, or 127.0.0.1 when it listens everywhere."""
    host = address if address and address not in ("0.0.0.0", "::") else "127.0.0.1"
    if ":" in host and not host.startswith("["):
        host = f"[{host}]"
    return f"http://{host}:{port}/"


def run_flower(settings: Settings, argv: list[str]) -> int:
    """Run Flower in the foreground for the fleet's broker (until SIGTERM or Ctrl-C); its exit code."""
    from sandfleet.core.queue import (
        make_app,  # the producer's app: Flower needs the broker, not the task code
    )

    app = make_app(settings)
    code = app.start(["flower", *argv])
    return code or 0


@click.command()
@click.option("--port", default=DEFAULT_PORT, show_default=True, type=click.IntRange(1, 65535))
@click.option(
    "--address",
    default=DEFAULT_ADDRESS,
    show_default=True,
    help="Address to listen on. Anything but a loopback address needs --basic-auth.",
)
@click.option(
    "--basic-auth",
    "basic_auth",
    envvar=AUTH_ENVVAR,
    default=None,
    metavar="USER:PASS",
    help=f"Ask for this user and password (several: comma-separated). Also read from {AUTH_ENVVAR}.",
)
@click.option("--read-only", is_flag=True, help="Hide the buttons that revoke tasks and stop workers.")
def flower(port: int, address: str, basic_auth: str | None, read_only: bool) -> None:
    """Start Flower for the fleet (its broker is SANDFLEET_REDIS_URL).

    Flower shows tasks that run while it is up: start it before the jobs you want to watch.
    """
    try:
        auth_pairs = check_exposure(address, basic_auth)
    except ValueError as e:
        raise click.UsageError(str(e)) from None
    settings = get_settings()
    echo(
        f"Flower for the fleet at {flower_url(address, port)} (broker {redact_url(settings.redis_url)}, "
        f"basic auth {'on' if auth_pairs else 'off: localhost only'})",
        err=True,
    )
    raise SystemExit(run_flower(settings, flower_argv(port, address, auth_pairs, read_only=read_only)))
