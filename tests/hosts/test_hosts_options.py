"""A bad --hosts, --kill-host or --secure-redis is refused before anything starts (no namespace, no engine)."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from sandfleet.cli import main
from sandfleet.fleet import netns


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
    ],
)
def test_bad_hosts_options_are_refused_before_anything_starts(args: list[str], message: str) -> None:
    before = netns.namespaces()
    result = CliRunner().invoke(main, ["loadtest", *args, "--jobs", "1"])  # as typed (see test_flower_cli)
    assert result.exit_code == 2, result.output
    assert message in result.output
    assert netns.namespaces() == before
