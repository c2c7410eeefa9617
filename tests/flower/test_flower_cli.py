"""``sandfleet flower``: when it insists on basic auth, and what it hands Flower (no Flower started)."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from sandfleet.cli import main
from sandfleet.worker.cli import flower as flower_cli


@pytest.mark.parametrize("address", ["127.0.0.1", "127.0.0.2", "localhost", "::1", "[::1]"])
def test_loopback_addresses(address: str) -> None:
    assert flower_cli.is_loopback(address)


@pytest.mark.parametrize("address", ["", "0.0.0.0", "::", "10.0.0.5", "example.org", "flower.internal"])
def test_addresses_beyond_localhost(address: str) -> None:
    assert not flower_cli.is_loopback(address)


def test_localhost_needs_no_password() -> None:
    assert flower_cli.check_exposure("127.0.0.1", None) == []


@pytest.mark.parametrize("address", ["0.0.0.0", "", "192.168.1.10"])
def test_beyond_localhost_without_password_is_refused(address: str) -> None:
    with pytest.raises(
        ValueError, match=r"without a password.*--basic-auth USER:PASS.*SANDFLEET_FLOWER_AUTH"
    ):
        flower_cli.check_exposure(address, None)


def test_basic_auth_pairs() -> None:
    assert flower_cli.check_exposure("0.0.0.0", "admin:s3cret") == ["admin:s3cret"]
    assert flower_cli.parse_basic_auth("a:1, b:2") == ["a:1", "b:2"]


@pytest.mark.parametrize("value", ["admin", "admin:", ":pw", ",", "a:1,b"])
def test_malformed_basic_auth_is_refused_without_echoing_the_password(value: str) -> None:
    with pytest.raises(ValueError, match="USER:PASS") as info:
        flower_cli.parse_basic_auth(value)
    assert "1" not in str(info.value).replace("USER:PASS", "")


def test_argv_shows_job_id_and_question_columns_and_passes_auth() -> None:
    argv = flower_cli.flower_argv(5601, "0.0.0.0", ["admin:pw"], read_only=True)
    assert "--port=5601" in argv and "--address=0.0.0.0" in argv
    assert "--basic_auth=admin:pw" in argv and "--read_only=True" in argv
    columns = next(a for a in argv if a.startswith("--tasks_columns=")).split("=", 1)[1].split(",")
    assert {"name", "uuid", "args", "state"} <= set(columns)  # uuid is the job id; args starts the question


def test_url_for_a_browser() -> None:
    assert flower_cli.flower_url("0.0.0.0", 5555) == "http://127.0.0.1:5555/"
    assert flower_cli.flower_url("::1", 5555) == "http://[::1]:5555/"


def run_cli(args: list[str], env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> tuple[int, str, list]:
    """Run the command with Flower itself replaced by a recorder; (exit code, output, recorded argv)."""
    started: list = []
    monkeypatch.setattr(flower_cli, "run_flower", lambda settings, argv: started.append(argv) or 0)
    # Through the root command, as a user runs it: a subcommand invoked alone would cache click's help
    # option without the root's -h, and docs/cli.md rendered later in this process would drift.
    result = CliRunner().invoke(main, ["flower", *args], env=env)
    return result.exit_code, result.output, started


def test_cli_refuses_a_public_address_without_auth(monkeypatch: pytest.MonkeyPatch) -> None:
    code, output, started = run_cli(["--address", "0.0.0.0"], {"SANDFLEET_FLOWER_AUTH": ""}, monkeypatch)
    assert code == 2 and "refusing to start Flower on 0.0.0.0 without a password" in output
    assert started == []


def test_cli_reads_auth_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    env = {"SANDFLEET_FLOWER_AUTH": "ops:pw"}
    code, output, started = run_cli(["--address", "0.0.0.0", "--port", "5602"], env, monkeypatch)
    assert code == 0, output
    assert "--basic_auth=ops:pw" in started[0] and "--address=0.0.0.0" in started[0]
    assert "pw" not in output.replace("ops:pw", "")  # the banner says auth is on, not what it is
