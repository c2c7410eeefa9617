"""allow_hosts: parsing with hints, the config's refusals, and the operator's policy (jobs only narrow)."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from sandfleet.core.allowlist import AllowListError, decide, parse_rule, parse_rules
from sandfleet.core.config import SandboxConfig
from sandfleet.core.errors import PolicyViolationError
from sandfleet.core.settings import Settings
from sandfleet.worker.sandbox.policy import check_sandbox_policy


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        ("10.0.0.1", "IP addresses are not allowed"),
        ("[::1]:443", "IP addresses are not allowed"),
        ("2130706433", "IP addresses are not allowed"),
        ("https://pypi.org/simple", "not a URL"),
        ("*", "wildcard"),
        ("*.com", "too wide"),
        ("a.*.example.com", "only allowed as the first label"),
        ("pypi.org:0", "the port must be 1-65535"),
        ("pypi.org:http", "the port must be 1-65535"),
        ("bad_host!.org", "not a valid host name"),
        ("", "host names"),
    ],
)
def test_malformed_entries_are_refused_with_a_hint(entry: str, message: str) -> None:
    with pytest.raises(AllowListError, match=message):
        parse_rule(entry)


def test_names_wildcards_and_ports_match_as_documented() -> None:
    rules = parse_rules(["PyPI.org.", "*.pythonhosted.org", "api.example.com:8443"])
    assert [str(r) for r in rules] == ["api.example.com:8443", "pypi.org", "*.pythonhosted.org"]
    assert decide(rules, "pypi.org", 443) is None
    assert decide(rules, "files.pythonhosted.org", 443) is None
    assert decide(rules, "pythonhosted.org", 443) == "the name is not in the allow-list"
    assert decide(rules, "evilpythonhosted.org", 443) == "the name is not in the allow-list"
    assert decide(rules, "api.example.com", 443) == "port 443 is not allowed for this name (allowed: 8443)"
    assert decide(rules, "pypi.org", 22).startswith("port 22 is not allowed")
    assert decide(rules, "203.0.113.9", 443) == "IP addresses are not allowed, only names"


def test_config_refuses_restricted_without_hosts_and_hosts_without_restricted() -> None:
    with pytest.raises(ValidationError, match="network 'restricted' needs allow_hosts"):
        SandboxConfig(network="restricted")
    with pytest.raises(ValidationError, match="allow_hosts applies to network 'restricted' only"):
        SandboxConfig(allow_hosts=["pypi.org"])
    with pytest.raises(ValidationError, match="IP addresses are not allowed"):
        SandboxConfig(network="restricted", allow_hosts=["198.51.100.7"])
    with pytest.raises(ValidationError, match="use `allow_hosts`"):
        SandboxConfig.model_validate({"network": "restricted", "allowed_hosts": ["pypi.org"]})
    config = SandboxConfig(network="restricted", allow_hosts="pypi.org, files.pythonhosted.org")  # type: ignore[arg-type]
    assert config.allow_hosts == ("files.pythonhosted.org", "pypi.org")
    assert (
        SandboxConfig(backend="gvisor", network="restricted", allow_hosts=["pypi.org"]).docker_runtime
        == "runsc-egress"
    )


def policy(**env: str) -> Settings:
    return Settings(policy_networks=["none", "restricted"], **env)


def test_policy_lets_jobs_narrow_and_refuses_wider_lists() -> None:
    settings = policy(policy_allow_hosts="*.example.com,pypi.org")
    check_sandbox_policy(
        SandboxConfig(network="restricted", allow_hosts=["api.example.com", "pypi.org"]), settings
    )
    check_sandbox_policy(SandboxConfig(network="restricted", allow_hosts=["*.eu.example.com"]), settings)
    for wider, named in (
        (["example.com"], "example.com"),
        (["pypi.org:8443"], "pypi.org:8443"),
        (["files.pythonhosted.org"], "files.pythonhosted.org"),
    ):
        with pytest.raises(PolicyViolationError, match=f"sandbox allow_hosts {named} is not allowed"):
            check_sandbox_policy(SandboxConfig(network="restricted", allow_hosts=wider), settings)


def test_policy_with_no_hosts_refuses_restricted() -> None:
    with pytest.raises(PolicyViolationError, match="SANDFLEET_POLICY_ALLOW_HOSTS is empty"):
        check_sandbox_policy(SandboxConfig(network="restricted", allow_hosts=["pypi.org"]), policy())
