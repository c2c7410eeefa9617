"""A bad --hosts, --kill-host, --secure-redis, --sentinel or --kill-redis-primary is refused before anything starts (no namespace, no engine)."""

from __future__ import annotations

import os

import pytest
from click.testing import CliRunner

from sandfleet.cli import main
from sandfleet.fleet import netns
from sandfleet.fleet.hosts import BASE


def namespaces_of_this_process() -> set[str]:
    """The multi-host namespaces whose run this process owns (its owner.pid): host-fleet tests of
    other test processes make and remove their own meanwhile."""

    def owner(name: str) -> str:
        try:
            return (BASE / f"sfh-{name.split('-')[1]}" / "owner.pid").read_text()
        except (OSError, IndexError):
            return ""

    return {name for name in netns.namespaces() if owner(name) == str(os.getpid())}


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--local", "--hosts", "0"], "--hosts must be within 1..16"),
        (["--local", "--hosts", "17"], "--hosts must be within 1..16"),
        (["--hosts", "2"], "need --local"),
        (["--local", "--kill-host", "1"], "--kill-host needs --hosts N"),
        (["--local", "--hosts", "1", "--kill-host", "1"], "at least --hosts 2"),
        (["--local", "--hosts", "3", "--kill-host", "4"], "within 1..3"),
        (["--local", "--hosts", "2", "--workers", "2"], "each host runs one worker"),
        (["--local", "--secure-redis"], "--secure-redis needs --local --hosts N"),
        (["--local", "--sentinel"], "--sentinel needs --local --hosts N"),
        (["--local", "--hosts", "2", "--kill-redis-primary"], "--kill-redis-primary needs --sentinel"),
        (["--local", "--hosts", "2", "--sentinel", "--secure-redis"], "cannot be combined"),
    ],
)
def test_bad_hosts_options_are_refused_before_anything_starts(args: list[str], message: str) -> None:
    before = namespaces_of_this_process()
    result = CliRunner().invoke(main, ["loadtest", *args, "--jobs", "1"])  # as typed (see test_flower_cli)
    assert result.exit_code == 2, result.output
    assert message in result.output
    assert namespaces_of_this_process() == before
