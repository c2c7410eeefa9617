"""One Docker engine of a multi-host fleet: a dockerd in the host's network namespace, with its own
socket, data-root, exec-root, pidfile, cgroup parent and iptables (those of its namespace).

The machine's own engine is never touched: this dockerd reads its own (empty) config file, so it
registers no runtime of the machine's ``daemon.json``, and it has no default bridge (``--bridge none``,
safe here because the namespace has no ``docker0`` to delete; jobs run with network disabled). A fleet
with ``egress`` creates the internal egress network (a user-defined bridge) on it, whose rules the
engine and the worker write in the namespace's own iptables. Images come
from the machine's engine without a registry: ``docker save`` once into a cached tarball, ``docker
load`` into each engine. The socket belongs to the host's own user and group, mode 0660, so
a worker of another host (another group, no capabilities) cannot open it.
"""

from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from sandfleet.fleet import netns

ENGINE_READY_TIMEOUT_S = 60.0
ENGINE_STOP_TIMEOUT_S = 30.0
IMAGE_CACHE = Path("/tmp/sfh-images")
ENGINE_FOLDER_UID = 21_300_000  # owns every engine folder; no process runs as it


@dataclass
class HostEngine:
    """A dockerd in ``namespace``; everything it keeps is under ``folder`` (0700, root's).

    ``owner_uid``: the host's uid and gid, whose worker alone may open the socket.
    """

    namespace: str
    folder: Path
    owner_uid: int
    process: subprocess.Popen[bytes] | None = None

    @property
    def socket_path(self) -> Path:
        return self.folder.parent / "sock" / "docker.sock"

    @property
    def url(self) -> str:
        return f"unix://{self.socket_path}"

    @property
    def pidfile(self) -> Path:
        return self.folder / "docker.pid"

    def command(self) -> list[str]:
        config = self.folder / "daemon.json"
        return [
            *netns.enter(self.namespace),
            "dockerd",
            f"--config-file={config}",
            f"--host={self.url}",
            f"--data-root={self.folder / 'data'}",
            f"--exec-root={self.folder / 'x'}",
            f"--pidfile={self.pidfile}",
            f"--cgroup-parent=/{self.namespace}",
            "--bridge=none",
            "--iptables=true",
            "--ip-masq=false",
            "--log-level=warn",
        ]

    def start(self) -> None:
        """Start dockerd (removing the pidfile a killed one left) and wait until it answers."""
        self.folder.mkdir(parents=True, exist_ok=True, mode=0o700)
        os.chown(self.folder, ENGINE_FOLDER_UID, 0)  # not uid 0: workers (uid 0, no caps) stay out
        self.socket_path.parent.mkdir(parents=True, exist_ok=True)
        os.chown(self.socket_path.parent, self.owner_uid, self.owner_uid)
        self.socket_path.parent.chmod(0o770)
        (self.folder / "daemon.json").write_text("{}\n")
        for stale in (self.pidfile, self.folder / "x" / "containerd" / "containerd.pid"):
            stale.unlink(missing_ok=True)
        log = open(self.folder / "dockerd.log", "ab")  # noqa: SIM115 - the child holds it
        try:
            self.process = subprocess.Popen(
                self.command(), stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )
        finally:
            log.close()
        self._wait_ready()
        os.chown(self.socket_path, self.owner_uid, self.owner_uid)
        os.chmod(self.socket_path, 0o660)

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + ENGINE_READY_TIMEOUT_S
        while not self.answers():
            assert self.process is not None
            if self.process.poll() is not None or time.monotonic() > deadline:
                tail = (self.folder / "dockerd.log").read_text(errors="replace")[-2000:]
                raise RuntimeError(f"dockerd of {self.namespace} did not start:\n{tail}")
            time.sleep(0.2)

    def answers(self) -> bool:
        done = subprocess.run(
            ["docker", f"--host={self.url}", "version", "--format", "{{.Server.Version}}"],
            capture_output=True,
            timeout=10,
            check=False,
        )
        return done.returncode == 0

    def sandboxes(self) -> list[str]:
        """Ids of the Sandfleet containers (any state) on this engine."""
        done = subprocess.run(
            ["docker", f"--host={self.url}", "ps", "-aq", "--filter", "label=sandfleet.role"],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
        if done.returncode != 0:
            raise RuntimeError(f"docker ps on {self.namespace}: {done.stderr.strip()}")
        return done.stdout.split()

    def load_images(self, tarball: Path) -> None:
        """``docker load`` the cached tarball into this engine."""
        done = subprocess.run(
            ["docker", f"--host={self.url}", "load", "-q", "-i", str(tarball)],
            capture_output=True,
            text=True,
            check=False,
        )
        if done.returncode != 0:
            raise RuntimeError(f"docker load into {self.namespace}: {done.stderr.strip()}")

    def processes(self) -> set[int]:
        """dockerd, its containerd and shims (they name the folder) and the containers (its cgroup)."""
        return set(netns.processes_mentioning(str(self.folder))) | netns.cgroup_pids(self.namespace)

    def kill(self) -> None:
        """SIGKILL the engine and everything it runs at once: the host is lost."""
        netns.kill_all(self.processes())
        if self.process is not None:
            self.process.wait()

    def stop(self) -> None:
        """SIGTERM dockerd (it stops its containers and unmounts), then kill what is left."""
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=ENGINE_STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                pass
        netns.kill_all(self.processes())
        if self.process is not None and self.process.poll() is None:
            self.process.wait()
        netns.unmount_under(self.folder)
        netns.remove_cgroup(self.namespace)


def cached_image_tarball(images: list[str]) -> Path:
    """``docker save`` of ``images`` from the machine's engine, once per set of image ids (0600)."""
    ids = []
    for image in images:
        done = subprocess.run(
            ["docker", "image", "inspect", "--format", "{{.Id}}", image],
            capture_output=True,
            text=True,
            check=False,
        )
        if done.returncode != 0:
            raise RuntimeError(f"image {image} is not on this machine's engine: build it first")
        ids.append(done.stdout.strip())
    IMAGE_CACHE.mkdir(mode=0o700, exist_ok=True)
    name = hashlib.sha256("\n".join(sorted(ids)).encode()).hexdigest()[:16]
    tarball = IMAGE_CACHE / f"{name}.tar"
    if not tarball.exists():
        partial = tarball.with_suffix(f".{os.getpid()}.part")
        done = subprocess.run(["docker", "save", "-o", str(partial), *images], capture_output=True, text=True)
        if done.returncode != 0:
            partial.unlink(missing_ok=True)
            raise RuntimeError(f"docker save {' '.join(images)}: {done.stderr.strip()}")
        partial.rename(tarball)
    return tarball
