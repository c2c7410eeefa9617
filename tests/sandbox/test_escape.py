"""The escape program: one hostile Python program tries every way out, under runc and under runsc.

It runs inside the sandbox and reports each attempt as JSON; the test compares what it saw with the
host's own files and environment. Every attempt must be a dead end. The network attempts run with
network "none" and aim at a name under ``.invalid`` and at an address this test run owns
(tests/owned_targets.py): had one got through, it would have arrived here, and the test checks that
nothing did.
"""

from __future__ import annotations

import io
import json
import os
import tarfile
from pathlib import Path
from typing import Any

import pytest

from sandfleet.core.config import DEFAULT_IMAGE

SECRET = "sk-test-leak"
ESCAPE_PROGRAM = r"""
import json, os, socket, sys

report = {}


def attempt(name, action):
    try:
        report[name] = {"ok": True, "value": action()}
    except Exception as e:
        report[name] = {"ok": False, "error": f"{type(e).__name__}: {e}"}


def listing(path):
    return sorted(os.listdir(path))


def homes():
    found = {}
    for name in os.listdir("/home"):
        try:
            found[name] = listing(os.path.join("/home", name))
        except OSError as e:
            found[name] = f"{type(e).__name__}"
    return found


def environs():
    found = {}
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                with open(f"/proc/{pid}/environ", "rb") as f:
                    found[pid] = f.read().decode(errors="replace")
            except OSError as e:
                found[pid] = f"unreadable: {type(e).__name__}"
    return found


def read(path):
    with open(path, "rb") as f:
        return f.read().decode(errors="replace")


def write_profile():
    with open("/etc/profile.d/sandfleet-escape.sh", "w") as f:
        f.write("echo escaped\n")
    return "written"


def connect_ip():
    with socket.create_connection((sys.argv[2], 53), timeout=3):
        return "connected"


def docker_socket():
    with socket.socket(socket.AF_UNIX) as s:
        s.settimeout(3)
        s.connect("/var/run/docker.sock")
        return "connected"


host_paths = json.loads(sys.argv[1])
attempt("passwd", lambda: read("/etc/passwd"))
attempt("root_home", lambda: listing("/root"))
attempt("home", homes)
attempt("work", lambda: listing("/work"))
attempt("host_paths", lambda: [p for p in host_paths if os.path.lexists(p)])
attempt("mountinfo", lambda: read("/proc/self/mountinfo"))
attempt("environ", lambda: dict(os.environ))
attempt("init_environ", lambda: read("/proc/1/environ"))
attempt("proc_environs", environs)
attempt("write_profile_d", write_profile)
attempt("dns", lambda: socket.getaddrinfo("escape.sandfleet.invalid", 443))
attempt("connect_ip", connect_ip)
attempt("docker_socket_files", lambda: [p for p in ("/var/run/docker.sock", "/run/docker.sock")
                                         if os.path.lexists(p)])
attempt("docker_socket", docker_socket)
print(json.dumps(report))
"""


def image_files(paths: tuple[str, ...]) -> dict[str, dict[str, bytes | None]]:
    """The image's own copy of some paths, read from a created (never started) container.

    Returns {path: {member name below path: file content, or None for folders and links}}.
    """
    from sandfleet.worker.sandbox.docker.backend import docker_client

    from .helpers import plain_container_labels

    client = docker_client()
    probe = client.containers.create(
        DEFAULT_IMAGE,
        command=["true"],
        network_mode="none",
        labels=plain_container_labels("test-image-probe"),
    )
    try:
        found: dict[str, dict[str, bytes | None]] = {}
        for path in paths:
            chunks, _ = probe.get_archive(path)
            with tarfile.open(fileobj=io.BytesIO(b"".join(chunks))) as archive:
                found[path] = {}
                for member in archive.getmembers():
                    name = member.name.split("/", 1)[1] if "/" in member.name else ""
                    data = archive.extractfile(member) if member.isfile() else None
                    found[path][name] = data.read() if data else None
        return found
    finally:
        probe.remove(force=True)


@pytest.fixture(scope="module")
def image_view(docker_engine: Any) -> dict[str, Any]:
    files = image_files(("/etc/passwd", "/root", "/home"))
    passwd = files["/etc/passwd"][""]
    assert passwd is not None
    return {"passwd": passwd.decode(), "root": set(files["/root"]) - {""}, "home": set(files["/home"]) - {""}}


def host_names(folder: str) -> set[str]:
    try:
        return set(os.listdir(folder))
    except OSError:
        return set()


def test_every_escape_is_a_dead_end(
    backend: str,
    open_session: Any,
    image_view: dict[str, Any],
    owned_targets: Any,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", SECRET)  # before the sandbox starts: the worker's secret
    canary = tmp_path / "host-canary.txt"
    canary.write_text("host only")
    repo_file = str(Path(__file__).resolve())
    host_paths = [str(canary), repo_file, "/work/main", "/work/shared", "/home/cloudsdk/.bashrc"]

    session = open_session(backend)
    session.write_file("escape.py", ESCAPE_PROGRAM)
    mark = owned_targets.mark()
    result = session.execute(
        ["python3", "escape.py", json.dumps(host_paths), owned_targets.public_v4], timeout=60
    )
    assert result.exit_code == 0, result.stderr
    report = json.loads(result.stdout)

    # /etc/passwd is the image's own: none of the host's accounts that the image lacks.
    assert report["passwd"]["ok"]
    seen = report["passwd"]["value"]
    assert seen == image_view["passwd"]
    host_only_accounts = set(Path("/etc/passwd").read_text().splitlines()) - set(seen.splitlines())
    assert not host_only_accounts & set(seen.splitlines())
    assert any(line.split(":")[2] == "10001" for line in seen.splitlines())

    # The host's home folders and the repository are not there.
    root = report["root_home"]
    if root["ok"]:
        assert set(root["value"]) <= image_view["root"]
        assert not (host_names("/root") - image_view["root"]) & set(root["value"])
    else:
        assert "PermissionError" in root["error"] or "FileNotFoundError" in root["error"]
    assert report["home"]["ok"] or "FileNotFoundError" in report["home"]["error"]
    homes_seen = set(report["home"].get("value") or {})
    assert homes_seen <= {name.split("/")[0] for name in image_view["home"]}
    assert not (host_names("/home") - image_view["home"]) & homes_seen
    assert not report["work"]["ok"] or not host_names("/work") & set(report["work"]["value"])
    assert report["host_paths"] == {"ok": True, "value": []}
    assert report["mountinfo"]["ok"]
    for line in report["mountinfo"]["value"].splitlines():  # no host folder is mounted in
        source, target = line.split()[3:5]
        for host_path in ("/work", "/home", "/root", "/var/run", "/run/docker", str(tmp_path)):
            assert not (source + "/").startswith(host_path + "/"), line
            assert not (target + "/").startswith(host_path + "/"), line

    # The worker's environment did not leak in: only the configured base environment is set.
    environ = report["environ"]["value"]
    assert set(environ) == {"PATH", "HOME", "LANG", "PYTHONDONTWRITEBYTECODE", "PYTHONIOENCODING"}
    assert SECRET not in json.dumps(environ)
    if report["init_environ"]["ok"]:
        assert SECRET not in report["init_environ"]["value"]
        assert "OPENAI_API_KEY" not in report["init_environ"]["value"]
    assert SECRET not in json.dumps(report["proc_environs"])

    # Nothing can be planted in the image's shell start-up files.
    assert not report["write_profile_d"]["ok"]
    assert any(
        e in report["write_profile_d"]["error"] for e in ("Read-only file system", "Permission denied")
    )

    # No network: no resolver to ask (EAI_AGAIN; a resolver would have said NXDOMAIN for .invalid),
    # no route to an address (runc: only lo; gVisor's stack: no route), nothing arrived; no Docker socket.
    assert not report["dns"]["ok"], report["dns"]
    assert "Temporary failure in name resolution" in report["dns"]["error"], report["dns"]
    assert not report["connect_ip"]["ok"], report["connect_ip"]
    assert any(e in report["connect_ip"]["error"] for e in ("Network is unreachable", "No route to host"))
    assert owned_targets.arrived_since(mark) == {}
    assert report["docker_socket_files"] == {"ok": True, "value": []}
    assert not report["docker_socket"]["ok"]
    assert "FileNotFoundError" in report["docker_socket"]["error"]
