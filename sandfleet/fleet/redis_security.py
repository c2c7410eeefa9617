"""A Redis secured as deploy/SCALING.md §4a asks of one across hosts, for local fleets: TLS with a CA
of the run's own, and an ACL user per role (deploy/redis-acl.conf) with passwords made per run.

The multi-host fleet (hosts.py, ``secured=True``) starts its Redis with :meth:`RedisSecurity.server_args`
and hands each party only its own role's URL: workers ``worker``, the driver ``producer``, readers
``auditor``; ``fleet-admin`` (every command) is the harness's own, for readiness and teardown.
"""

from __future__ import annotations

import secrets
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

ACL_FILE = Path(__file__).resolve().parents[2] / "deploy" / "redis-acl.conf"
ROLES = ("worker", "producer", "auditor")
ADMIN = "fleet-admin"


def _openssl(*args: str) -> None:
    subprocess.run(["openssl", *args], check=True, capture_output=True, timeout=60)


def make_ca_and_cert(folder: Path, name: str, address: str = "127.0.0.1") -> tuple[Path, Path, Path]:
    """A CA and a server certificate for the IP ``address`` signed by it: ``(ca, cert, key)``.

    Raises:
        FileNotFoundError: openssl is not installed. subprocess.CalledProcessError: it failed.
    """
    folder.mkdir(parents=True, exist_ok=True)
    ca_key, ca = folder / f"{name}-ca.key", folder / f"{name}-ca.pem"
    key, csr, cert = folder / f"{name}.key", folder / f"{name}.csr", folder / f"{name}.pem"
    _openssl(
        "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
        "-subj", f"/CN={name} CA", "-keyout", str(ca_key), "-out", str(ca),
    )  # fmt: skip
    _openssl(
        "req", "-newkey", "rsa:2048", "-nodes", "-subj", f"/CN={address}",
        "-keyout", str(key), "-out", str(csr),
    )  # fmt: skip
    ext = folder / f"{name}.ext"
    ext.write_text(f"subjectAltName=IP:{address}\n")
    _openssl(
        "x509", "-req", "-in", str(csr), "-CA", str(ca), "-CAkey", str(ca_key), "-CAcreateserial",
        "-days", "2", "-extfile", str(ext), "-out", str(cert),
    )  # fmt: skip
    for private in (ca_key, key):
        private.chmod(0o600)
    ca.chmod(0o644)  # every host's worker verifies the server against it
    return ca, cert, key


def acl_rules(passwords: dict[str, str]) -> list[str]:
    """deploy/redis-acl.conf's ``user`` lines with each ``>ROLE_PASSWORD`` replaced from ``passwords``."""
    if not ACL_FILE.exists():
        raise FileNotFoundError(f"{ACL_FILE} is missing: a secured fleet runs from the repository")
    lines = []
    for line in ACL_FILE.read_text().splitlines():
        if not line.startswith("user "):
            continue
        name = line.split()[1]
        placeholder = f">{name.upper()}_PASSWORD"
        if placeholder in line:
            line = line.replace(placeholder, f">{passwords.get(name, secrets.token_hex(16))}")
        lines.append(line)
    return lines


@dataclass
class RedisSecurity:
    """The run's CA, the server's certificate and key, and a password per role, under ``folder``."""

    folder: Path
    address: str
    passwords: dict[str, str] = field(
        default_factory=lambda: {role: secrets.token_hex(24) for role in (*ROLES, ADMIN)}
    )
    ca: Path = Path()
    cert: Path = Path()
    key: Path = Path()
    acl_path: Path = Path()

    def create(self) -> RedisSecurity:
        """Write the CA, the certificate and key, and the ACL file (passwords are made with the object)."""
        self.folder.mkdir(parents=True, exist_ok=True)
        self.folder.chmod(0o755)  # the CA is read by every host's worker; the keys stay 0600
        self.ca, self.cert, self.key = make_ca_and_cert(self.folder, "fleet-redis", self.address)
        self.acl_path = self.folder / "users.acl"
        admin = f"user {ADMIN} on >{self.passwords[ADMIN]} ~* &* +@all"
        self.acl_path.write_text("\n".join([*acl_rules(self.passwords), admin]) + "\n")
        self.acl_path.chmod(0o600)
        return self

    def server_args(self, port: int) -> list[str]:
        """redis-server options: TLS only on ``port`` (no plain port), the ACL users, no default user."""
        return [
            "--port", "0", "--tls-port", str(port),
            "--tls-cert-file", str(self.cert), "--tls-key-file", str(self.key),
            "--tls-ca-cert-file", str(self.ca), "--tls-auth-clients", "no",
            "--aclfile", str(self.acl_path),
        ]  # fmt: skip

    def url(self, role: str, port: int, db: int = 0) -> str:
        """``rediss://ROLE:PASSWORD@ADDRESS:PORT/DB`` for ``role`` (a role of ROLES or ADMIN)."""
        return f"rediss://{role}:{self.passwords[role]}@{self.address}:{port}/{db}"
