"""A test HTTPS service in a network namespace of its own, reached from the host through a veth pair.

Its own certificate authority signs one certificate for every name in NAMES; the proxy resolves the
names from a hosts file written here (nothing is in DNS). Used by tests/egress and benchmarks/egress.py.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

NAMES = ("api.egress.test", "other.egress.test", "mirror.egress.test")
SERVER = Path(__file__).with_name("https_server.py")


def _run(*args: str) -> None:
    done = subprocess.run(list(args), capture_output=True, text=True, timeout=60)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(args)}: {done.stderr.strip()}")


def make_ca(folder: Path, names: tuple[str, ...] = NAMES) -> tuple[Path, Path, Path]:
    """(ca.pem, server.pem, server.key): a CA and a certificate for ``names`` signed by it."""
    folder.mkdir(parents=True, exist_ok=True)
    ca_key, ca, key, csr, cert = (
        folder / n for n in ("ca.key", "ca.pem", "server.key", "server.csr", "server.pem")
    )
    _run("openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", "/CN=sandfleet test CA",
         "-keyout", str(ca_key), "-out", str(ca))  # fmt: skip
    _run("openssl", "req", "-newkey", "rsa:2048", "-nodes", "-subj", f"/CN={names[0]}", "-keyout", str(key),
         "-out", str(csr))  # fmt: skip
    ext = folder / "san.ext"
    ext.write_text("subjectAltName=" + ",".join(f"DNS:{n}" for n in names) + "\n")
    _run("openssl", "x509", "-req", "-in", str(csr), "-CA", str(ca), "-CAkey", str(ca_key), "-CAcreateserial",
         "-days", "2", "-extfile", str(ext), "-out", str(cert))  # fmt: skip
    return ca, cert, key


@dataclass
class TestService:
    """The running service: its namespace, address, CA and the hosts file naming it."""

    netns: str
    host_veth: str
    address: str
    folder: Path
    process: subprocess.Popen[bytes] | None = None
    names: tuple[str, ...] = NAMES
    ca: Path = field(init=False)
    hosts_file: Path = field(init=False)

    @classmethod
    def start(cls, folder: Path, tag: str, octet: int) -> TestService:
        """Start the service in namespace ``sfeg-<tag>`` at 10.231.<octet>.2 (host side .1)."""
        service = cls(
            netns=f"sfeg-{tag}", host_veth=f"sfsv{tag}"[:15], address=f"10.231.{octet}.2", folder=folder
        )
        service._up(octet)
        return service

    def _up(self, octet: int) -> None:
        inner = f"sfsi{self.host_veth[4:]}"[:15]
        self.stop()
        _run("ip", "netns", "add", self.netns)
        _run("ip", "link", "add", self.host_veth, "type", "veth", "peer", "name", inner)
        _run("ip", "link", "set", inner, "netns", self.netns)
        _run("ip", "addr", "add", f"10.231.{octet}.1/30", "dev", self.host_veth)
        _run("ip", "link", "set", self.host_veth, "up")
        _run("ip", "netns", "exec", self.netns, "ip", "addr", "add", f"{self.address}/30", "dev", inner)
        _run("ip", "netns", "exec", self.netns, "ip", "link", "set", inner, "up")
        _run("ip", "netns", "exec", self.netns, "ip", "link", "set", "lo", "up")
        self.ca, cert, key = make_ca(self.folder)
        self.index.mkdir(exist_ok=True)
        self.hosts_file = self.folder / "hosts"
        self.hosts_file.write_text("".join(f"{self.address} {name}\n" for name in self.names))
        os.chmod(self.folder, 0o755)
        os.chmod(self.hosts_file, 0o644)
        python = shutil.which("python3") or sys.executable
        self.process = subprocess.Popen(
            ["ip", "netns", "exec", self.netns, python, "-I", str(SERVER), str(cert), str(key), str(self.index)],
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        assert self.process.stdout is not None
        if self.process.stdout.readline().strip() != b"ready":
            raise RuntimeError("the test service did not start")
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                socket.create_connection((self.address, 443), timeout=0.5).close()
                return
            except OSError:
                time.sleep(0.05)
        raise RuntimeError("the test service does not answer on 443")

    @property
    def index(self) -> Path:
        """The private mirror's folder: wheels in ``index/<name>/`` are served at
        ``https://mirror.egress.test/simple/<name>/`` (PEP 503)."""
        return self.folder / "index"

    def stop(self) -> None:
        if self.process is not None:
            self.process.kill()
            self.process.wait()
            if self.process.stdout is not None:
                self.process.stdout.close()
            self.process = None
        subprocess.run(["ip", "link", "del", self.host_veth], capture_output=True)
        subprocess.run(["ip", "netns", "del", self.netns], capture_output=True)
