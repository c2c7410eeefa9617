"""From a SandboxConfig to the exact container Docker is asked for: a pure function, unit-tested.

Every setting that makes the sandbox safe is decided here, in one place:
no network (unless configured; made the cheapest proven way, see NETWORK_DISABLED_RUNTIMES),
read-only root, all capabilities dropped, no-new-privileges, pids/memory(+swap)/CPU limits, tmpfs
workdir and /tmp, the agent as init (pid 1), nofile and core ulimits, the unprivileged user, only
the configured environment, and no log kept by the engine.
"""

from __future__ import annotations

import functools
import hashlib
import marshal
import os
import socket
import struct
import sys
from dataclasses import dataclass
from importlib.util import MAGIC_NUMBER
from pathlib import Path
from typing import Any

from sandfleet.core.config import SandboxConfig
from sandfleet.worker.sandbox.docker.labels import LABEL_CONFIG, LABEL_OWNER, LABEL_PERSISTENT, LABEL_ROLE

SANDBOX_UID = 10001
SANDBOX_GID = 10001
TMP_SIZE = "64m"
NOFILE_LIMIT = 1024
# Under gVisor the pids cgroup also counts the sandbox kernel's own host threads (several per task:
# 256 sleeping tasks need more than 2048), so the pids limit is enforced inside gVisor as
# RLIMIT_NPROC (its kernel applies it per sandbox) and the host cgroup gets a larger backstop.
GVISOR_HOST_THREADS_PER_TASK = 16
GVISOR_HOST_PIDS_MIN = 4096
INSIDE = Path(__file__).resolve().parent.parent / "inside"  # what runs in the container, sent in as files
AGENT_SOURCE = INSIDE / "agent.py"
PAYLOAD_CACHE = INSIDE / "__pycache__" / f"agent-payload.{sys.implementation.cache_tag}.bin"
# Modules shipped with the agent, registered under these names before it runs (agent.py imports them).
AGENT_MODULES = {
    "sandfleet_protocol": INSIDE / "protocol.py",
    "sandfleet_syscall_filter": INSIDE / "syscall_filter.py",
}
# Network "none" the cheapest way proven equal from inside (tests/sandbox/test_network.py). With
# ``network_disabled`` (the API's NetworkDisabled) the runtime makes the container a fresh network
# namespace holding only ``lo``; ``network_mode="none"`` gets the same namespace from the engine's
# network library, which first builds a "none" network sandbox for it (a prestart hook, /etc/hosts,
# resolv.conf): 199 -> 117 ms per container and 8.4 -> 15.7 runs/s from 4 threads (HOST-FACTS.md).
# Proven under runc, and under gVisor registered with --network=none (deploy/bootstrap.sh), whose
# own stack holds only loopback either way; runsc without that flag refuses both ways to start.
# Any other runtime keeps network_mode="none". Either way the host checks what each sandbox's agent
# sees before using it (isolation.network_refusal). One difference: no /etc/hosts entries, so the
# name "localhost" does not resolve (127.0.0.1 and ::1 work).
NETWORK_DISABLED_RUNTIMES = frozenset({"runc", "runsc"})

# The container's main process: read the agent from stdin and run it. The agent itself is sent by
# the host, so the image needs nothing of ours and agent and host always speak the same protocol
# version. It comes as length-prefixed parts: the host's bytecode magic number, the count of the
# modules shipped with the agent, then for each its name, its code compiled by the host (marshal) and
# its source, and last the agent's code and source. A sandbox whose Python has the same magic runs
# the bytecode (saving ~3 ms of CPU per container); any other compiles the source.
BOOT = (
    "import sys\n"
    "f=frozenset(sys.modules)\n"  # what a fresh interpreter has loaded (agent.become_program)
    "if sys.path and not sys.path[0]:del sys.path[0]\n"  # -c put the working folder first
    "import os,struct\n"
    "def r(n):\n"
    " b=b''\n"
    " while len(b)<n:\n"
    "  c=os.read(0,n-len(b))\n"
    "  if not c: raise SystemExit(3)\n"
    "  b+=c\n"
    " return b\n"
    "def p():return r(struct.unpack('!I',r(4))[0])\n"
    "m=p()\n"
    "def load(name):\n"
    " c,s=p(),p()\n"
    " try:\n"
    "  import marshal\n"
    "  from _frozen_importlib_external import MAGIC_NUMBER\n"
    "  k=marshal.loads(c) if m==MAGIC_NUMBER else None\n"
    " except Exception:\n"
    "  k=None\n"
    " return k,k or compile(s,name,'exec')\n"
    "for _ in range(int(p())):\n"
    " n=p().decode();d=type(sys)(n);exec(load(n)[1],d.__dict__);sys.modules[n]=d\n"
    "k,c=load('sandfleet-agent')\n"
    "g={'__name__':'sandfleet_agent','BOOTED_FROM':'bytecode' if k else 'source','STARTUP_MODULES':f}\n"
    "exec(c,g)\n"
)


@functools.lru_cache(maxsize=1)
def agent_payload() -> bytes:
    """The agent framed for BOOT, from PAYLOAD_CACHE when that was made from the same sources.

    Compiling the agent and its modules took ~7 ms of CPU, once per process: nothing for a worker,
    2-3 % of a one-off ``sandfleet sandbox run``. The cache sits in the package's own __pycache__
    beside the bytecode Python itself caches for these files (who can write it can write agent.py),
    keyed by the SHA-256 of the magic number and every source; it is written as Python writes .pyc
    files (not under PYTHONDONTWRITEBYTECODE, never failing when the folder is read-only).
    """
    sources = [AGENT_SOURCE.read_bytes(), *(path.read_bytes() for path in AGENT_MODULES.values())]
    key = hashlib.sha256(MAGIC_NUMBER + b"".join(struct.pack("!I", len(s)) + s for s in sources)).digest()
    try:
        cached = PAYLOAD_CACHE.read_bytes()
        if cached[: len(key)] == key:
            return cached[len(key) :]
    except OSError:
        pass
    payload = boot_payload(sources[0])
    if not sys.dont_write_bytecode:
        _write_quietly(PAYLOAD_CACHE, key + payload)
    return payload


def _write_quietly(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` atomically (a reader sees the old file or the new), or not at all."""
    partial = path.with_name(f"{path.name}.{os.getpid()}.partial")
    try:
        path.parent.mkdir(exist_ok=True)
        partial.write_bytes(data)
        os.replace(partial, path)
    except OSError:
        partial.unlink(missing_ok=True)


def boot_payload(source: bytes, magic: bytes = MAGIC_NUMBER) -> bytes:
    """``source`` framed for BOOT with the AGENT_MODULES: magic number, then each module's name,
    bytecode compiled here and source, then the agent's bytecode and source."""
    parts = [magic, str(len(AGENT_MODULES)).encode()]
    for name, path in AGENT_MODULES.items():
        parts += [name.encode(), *_compiled(path.read_bytes(), name)]
    parts += _compiled(source, "sandfleet-agent")
    return b"".join(struct.pack("!I", len(part)) + part for part in parts)


def _compiled(source: bytes, name: str) -> list[bytes]:
    return [marshal.dumps(compile(source, name, "exec", dont_inherit=True)), source]


@dataclass(frozen=True)
class Owner:
    """The process that owns a container: host name, pid and the pid's start time (pids get reused)."""

    host: str
    pid: int
    started: int

    @classmethod
    def current(cls) -> Owner:
        return cls(socket.gethostname(), os.getpid(), process_start_ticks(os.getpid()) or 0)

    def label(self) -> str:
        return f"{self.host}:{self.pid}:{self.started}"

    @classmethod
    def parse(cls, label: str) -> Owner | None:
        try:
            host, pid, started = label.rsplit(":", 2)
            return cls(host, int(pid), int(started))
        except ValueError:
            return None

    def is_alive(self) -> bool:
        """True when this owner is a live process on this host (unknown hosts count as alive)."""
        if self.host != socket.gethostname():
            return True
        return process_start_ticks(self.pid) == self.started


def process_start_ticks(pid: int) -> int | None:
    """A process's start time in clock ticks since boot (/proc/PID/stat field 22), None if gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_bytes()
    except OSError:
        return None
    return int(stat.rsplit(b")", 1)[1].split()[19])


def container_kwargs(
    config: SandboxConfig,
    *,
    owner: Owner,
    host_ncpu: int,
    labels: dict[str, str] | None = None,
    read_only_mounts: dict[str, str] | None = None,
) -> dict[str, Any]:
    """Keyword arguments for ``docker.DockerClient.containers.create`` for one sandbox.

    The CPU limit is clamped to the engine's CPUs (Docker refuses more than it has).
    ``read_only_mounts`` (host folder -> path inside) bind-mounts operator folders read-only (a
    wheelhouse for shell sessions); nothing is mounted otherwise.
    """
    uid, gid = (0, 0) if config.allow_sudo else (SANDBOX_UID, SANDBOX_GID)
    all_labels = {
        LABEL_ROLE: "sandbox",
        LABEL_OWNER: owner.label(),
        LABEL_CONFIG: config.fingerprint(),
        **({LABEL_PERSISTENT: "1"} if config.persistent else {}),
        **(labels or {}),
    }
    kwargs: dict[str, Any] = {
        "image": config.image,
        # The agent starts as a program does (``python3 -s``, the same environment) so that a
        # program can run in a fork of it (agent.starts_like_me).
        "command": ["python3", "-s", "-c", BOOT],
        "user": f"{uid}:{gid}",
        "working_dir": config.workdir,
        "environment": base_env(config),  # never the worker's; commands get config.env on top
        "hostname": "sandbox",
        "stdin_open": True,
        "detach": True,
        "tty": False,
        "labels": all_labels,
        "read_only": config.read_only_rootfs,
        "tmpfs": _tmpfs(config, uid, gid),
        "cap_drop": ["ALL"],
        "security_opt": ["no-new-privileges:true"],
        "pids_limit": host_pids_limit(config),
        "mem_limit": config.memory_limit,
        "memswap_limit": config.memory_limit,  # memory + swap = memory: swap off
        "nano_cpus": int(min(config.cpu_limit, host_ncpu) * 1e9),
        # No init in front of the agent: as pid 1 it is out of the program's reach under runc (the
        # kernel drops signals sent to init from inside) and it reaps orphans itself (agent.reap).
        # Ignoring SIGTERM as init does, it is stopped with SIGKILL (which comes from outside).
        "init": False,
        "stop_signal": "SIGKILL",
        "ulimits": _ulimits(config),
        **network_kwargs(config),
        "runtime": config.docker_runtime,
        "ipc_mode": "private",
        # Nobody reads a sandbox's logs: the host reads the attached stream. With Docker's default
        # json-file driver every byte the agent sends (output, files, artifacts) was also encoded
        # by dockerd and written to the host's disk until removal (benchmarks/container_options.py).
        "log_config": {"type": "none", "config": {}},
    }
    if config.network == "restricted":  # the operator's CA bundle for the package index (if any)
        from sandfleet.core.settings import get_settings
        from sandfleet.worker.egress.gateway import sandbox_mounts

        read_only_mounts = {**(read_only_mounts or {}), **sandbox_mounts(get_settings())}
    if read_only_mounts:
        kwargs["volumes"] = {
            host: {"bind": inside, "mode": "ro"} for host, inside in read_only_mounts.items()
        }
    return kwargs


def _tmpfs(config: SandboxConfig, uid: int, gid: int) -> dict[str, str]:
    """The writable folders, all in memory: the workdir (``disk_limit``, the program's user's) and the tmps."""
    opts = "rw,nosuid,nodev,noexec"
    return {
        config.workdir: f"{opts},size={config.disk_limit},uid={uid},gid={gid},mode=0700",
        "/tmp": f"{opts},size={TMP_SIZE},mode=1777",
        "/var/tmp": f"{opts},size={TMP_SIZE},mode=1777",
    }


def _ulimits(config: SandboxConfig) -> list[dict[str, Any]]:
    """Open files capped, no core dumps; RLIMIT_NPROC is per user across the host kernel under runc,
    so only gVisor gets it."""
    nproc = [{"name": "nproc", "soft": config.pids_limit, "hard": config.pids_limit}]
    return [
        {"name": "nofile", "soft": NOFILE_LIMIT, "hard": NOFILE_LIMIT},
        {"name": "core", "soft": 0, "hard": 0},
        *(nproc if config.is_gvisor else []),
    ]


def network_kwargs(config: SandboxConfig) -> dict[str, Any]:
    """How the container's network is asked for: disabled, "none" or the default bridge (see above)."""
    if config.network == "restricted":  # the egress network; its filter comes after the start
        from sandfleet.worker.egress.gateway import egress_gateway

        return egress_gateway().container_options()
    if config.network != "none":
        return {"network_mode": "bridge"}
    if config.docker_runtime in NETWORK_DISABLED_RUNTIMES:
        return {"network_disabled": True}
    return {"network_mode": "none"}


def host_pids_limit(config: SandboxConfig) -> int:
    """The container's pids cgroup limit: the configured one, or gVisor's backstop (see above)."""
    if config.is_gvisor:
        return max(GVISOR_HOST_PIDS_MIN, GVISOR_HOST_THREADS_PER_TASK * config.pids_limit)
    return config.pids_limit


def base_env(config: SandboxConfig) -> dict[str, str]:
    """The minimal environment of the agent, and of every command before the configured env
    (restricted adds the egress proxy's variables)."""
    proxy: dict[str, str] = {}
    if config.network == "restricted":
        from sandfleet.core.settings import get_settings
        from sandfleet.worker.egress.gateway import egress_gateway, sandbox_environment

        proxy = sandbox_environment(get_settings(), egress_gateway().network)
    return {
        **proxy,
        "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        "HOME": config.workdir,
        "LANG": "C.UTF-8",
        "PYTHONDONTWRITEBYTECODE": "1",
        "PYTHONIOENCODING": "utf-8",
    }


def command_env(config: SandboxConfig) -> dict[str, str]:
    """The environment a command or program sees: the configured env over the base."""
    return {**base_env(config), **config.env}


# container_kwargs key -> its name in the Engine API's create body (top level) or in its HostConfig,
# as the Docker SDK translates them (docker.models.containers and docker.types.containers).
_CONFIG_FIELDS = {
    "image": "Image",
    "command": "Cmd",
    "user": "User",
    "working_dir": "WorkingDir",
    "hostname": "Hostname",
    "labels": "Labels",
    "stop_signal": "StopSignal",
}
_HOST_FIELDS = {
    "read_only": "ReadonlyRootfs",
    "tmpfs": "Tmpfs",
    "cap_drop": "CapDrop",
    "security_opt": "SecurityOpt",
    "pids_limit": "PidsLimit",
    "mem_limit": "Memory",
    "memswap_limit": "MemorySwap",
    "nano_cpus": "NanoCpus",
    "init": "Init",
    "runtime": "Runtime",
    "ipc_mode": "IpcMode",
}
# Handled one by one in create_body; any other key is refused (a new hardening option must be
# translated here, never dropped on the way to the engine).
_SPECIAL_FIELDS = frozenset(
    {
        "environment",
        "stdin_open",
        "detach",
        "tty",
        "ulimits",
        "log_config",
        "network_disabled",
        "network_mode",
        "volumes",
    }
)


def create_body(kwargs: dict[str, Any]) -> dict[str, Any]:
    """The Engine API body of ``POST /containers/create`` for ``container_kwargs`` output: what the
    Docker SDK sends for them (tests/sandbox/test_create_body.py compares the two), so the SDK and the
    thin client (engine_api.py) create the same container.

    Raises:
        ValueError: a key this function does not know (it would otherwise not reach the engine).
    """
    unknown = set(kwargs) - set(_CONFIG_FIELDS) - set(_HOST_FIELDS) - _SPECIAL_FIELDS
    if unknown:
        raise ValueError(f"container options with no translation to the Engine API: {sorted(unknown)}")
    if not kwargs.get("detach") or kwargs.get("tty"):
        raise ValueError("a sandbox is created detached, without a TTY")
    host: dict[str, Any] = {api: kwargs[key] for key, api in _HOST_FIELDS.items() if key in kwargs}
    host["NetworkMode"] = kwargs.get("network_mode") or "default"
    if "ulimits" in kwargs:
        host["Ulimits"] = [
            {"Name": u["name"], "Soft": u["soft"], "Hard": u["hard"]} for u in kwargs["ulimits"]
        ]
    if "log_config" in kwargs:
        host["LogConfig"] = {"Type": kwargs["log_config"]["type"], "Config": kwargs["log_config"]["config"]}
    body: dict[str, Any] = {api: kwargs[key] for key, api in _CONFIG_FIELDS.items() if key in kwargs}
    if "environment" in kwargs:
        body["Env"] = [f"{name}={value}" for name, value in kwargs["environment"].items()]
    body |= {
        "Tty": False,
        "OpenStdin": bool(kwargs.get("stdin_open")),
        "StdinOnce": False,
        "AttachStdin": False,
        "AttachStdout": False,
        "AttachStderr": False,
        "NetworkDisabled": bool(kwargs.get("network_disabled")),
        "HostConfig": host,
    }
    if volumes := kwargs.get("volumes"):
        body["Volumes"] = {mount["bind"]: {} for mount in volumes.values()}
        host["Binds"] = [f"{path}:{mount['bind']}:{mount['mode']}" for path, mount in volumes.items()]
    return body
