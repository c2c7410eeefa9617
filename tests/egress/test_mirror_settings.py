"""The operator's mirror settings: a malformed index URL is refused at start; a CA bundle that is missing
or holds no certificate stops restricted sandboxes from starting (EgressError); the variables set."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from sandfleet.core.settings import Settings
from sandfleet.worker.egress.gateway import CA_INSIDE, network_of, sandbox_environment, sandbox_mounts
from sandfleet.worker.egress.squid import EgressError


@pytest.mark.parametrize(
    "url", ["mirror.example.com/simple", "ftp://mirror.example.com/simple", "https:///simple"]
)
def test_a_malformed_index_url_is_refused(url: str) -> None:
    with pytest.raises(ValidationError, match="give the index as https://HOST"):
        Settings(egress_pip_index_url=url)


def test_the_ca_bundle_must_be_a_readable_pem_file(tmp_path: Path) -> None:
    with pytest.raises(EgressError, match="cannot be read"):
        sandbox_mounts(Settings(egress_ca_file=str(tmp_path / "missing.pem")))
    junk = tmp_path / "junk.pem"
    junk.write_text("not a certificate\n")
    with pytest.raises(EgressError, match="holds no PEM certificate"):
        sandbox_mounts(Settings(egress_ca_file=str(junk)))
    assert sandbox_mounts(Settings(egress_ca_file=None)) == {}


def test_the_sandbox_variables(tmp_path: Path) -> None:
    ca = tmp_path / "ca.pem"
    ca.write_text("-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n")
    settings = Settings(egress_pip_index_url="https://mirror.example.com/simple", egress_ca_file=str(ca))
    env = sandbox_environment(settings, network_of(settings))
    assert env["PIP_INDEX_URL"] == "https://mirror.example.com/simple"
    assert env["PIP_CERT"] == env["SSL_CERT_FILE"] == env["REQUESTS_CA_BUNDLE"] == CA_INSIDE
    network = network_of(settings)
    assert env["HTTPS_PROXY"] == f"http://{network.gateway}:{network.proxy_port}"
    assert sandbox_mounts(settings) == {str(ca.resolve()): CA_INSIDE}
    unset = Settings(egress_pip_index_url=None, egress_ca_file=None)  # whatever the environment says
    plain = sandbox_environment(unset, network_of(unset))
    assert "PIP_INDEX_URL" not in plain and "SSL_CERT_FILE" not in plain
