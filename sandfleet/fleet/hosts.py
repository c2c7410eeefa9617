"""A multi-host fleet on one machine: N "hosts", each a network namespace with its own Docker engine
and its own worker, joined to a control namespace holding Redis. For tests, benchmarks and
``sandfleet loadtest --local --hosts N``; it maps to real hosts as deploy/SCALING.md §5 explains.

Layout of run ``R`` (a free number 1..250; every name starts with ``sfh``)::

    this namespace   sfh<R>r 10.213.R.254/24 ──┐  (the driver: producer, reader)
    sfh-R-c          bridge sfhbr 10.213.R.1/24, redis-server on 10.213.R.1:6379 (``secured``:
                     TLS only, a CA of the run's own, an ACL user per role: redis_security.py;
                     ``sentinel``: its replica on :6380 and three Sentinels on :26379-26381,
                     sentinel_redis.py, everyone on the ``sentinel://`` URL)
    sfh-R-<i>        sfh<R>h<i> 10.213.R.(10+i)/24 ──veth── sfh<R>c<i> on the bridge
                     dockerd (socket, data-root, exec-root, pidfile under /tmp/sfh-R/h<i>/,
                     cgroup parent /sfh-R-<i>, its own iptables), one ``sandfleet worker``
                     (``egress``: its own egress network 10.214.i.0/24, rules and Squid, all in
                     this namespace; the service address 10.213.R.2 on the control bridge)

No namespace has a default route, so the test range goes nowhere off the machine. Each host's worker
runs without any capability in a group of its own (gid 21300000 + 100 R + i) that alone may open its
engine's socket and folders: a worker cannot open another host's socket, nor reach its containers
(tests/hosts). All workers keep uid 0 (the interpreter may live under /root), so they could still
signal each other's processes: what a real host's process isolation adds (SCALING.md §5).

Everything is torn down by :meth:`HostFleet.stop` (context manager, and atexit), and what a killed
run left by :func:`clean_leftovers` (``sandfleet fleet down``).
"""

from __future__ import annotations

import atexit
import os
import random
import shutil
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import redis

from sandfleet.core.config import DEFAULT_IMAGE
from sandfleet.core.redis_connect import connect
from sandfleet.core.settings import Settings
from sandfleet.fleet import netns
from sandfleet.fleet.host_engine import HostEngine, cached_image_tarball
from sandfleet.fleet.local import SANDFLEET_ARGV, FleetConfig, LocalFleet, WorkerProcess
from sandfleet.fleet.local_redis import NO_PERSISTENCE
from sandfleet.fleet.redis_security import ADMIN, RedisSecurity
from sandfleet.fleet.sentinel_redis import SentinelPlacement, SentinelRedis
from sandfleet.fleet.skewed_clock import SLEEP_WITHOUT_ABSTIME, check_clocks, skewed_clock_env

MAX_HOSTS = 16
BASE = Path("/tmp")
SUBNET = "10.213.{run}"
REDIS_PORT = 6379
SENTINEL_PORTS = (REDIS_PORT, 6380, 26379, 26380, 26381)  # primary, replica, three Sentinels
HOST_UID_BASE = 21_300_000
BRIDGE = "sfhbr"
# The worker keeps uid 0 (the interpreter may live under /root) but no capability at all: file
# permissions then bind it like any user, so only its host's group opens its socket and folders.
# The machine's own socket is root's (0660): uid 0 would open it even without capabilities, so the
# worker's mount namespace covers it with /dev/null (no capability: it cannot unmount that).
HIDE_MACHINE_SOCKET = 'for s in /run/docker.sock /var/run/docker.sock; do [ -S "$s" ] && mount --bind /dev/null "$s"; done; exec "$@"'
NO_CAPABILITIES = ("--inh-caps=-all", "--bounding-set=-all", "--no-new-privs")
# An ``egress`` host's worker runs the egress gateway as a real host's worker does: iptables and
# NFLOG in its namespace (net_admin), setns into each sandbox's namespace (sys_admin), Squid dropping
# to its user (setuid, setgid, chown). sys_admin could also undo HIDE_MACHINE_SOCKET: SCALING.md §5.
EGRESS_CAPABILITIES = (
    "--inh-caps=-all",
    "--bounding-set=-all,+net_admin,+net_bind_service,+sys_admin,+sys_ptrace,+setuid,+setgid,+chown,+fowner,+dac_override,+kill",
    "--no-new-privs",
)
EGRESS_SUBNET = "10.214.{host}.0/24"  # each host's egress network, inside its namespace only
REDIS_READY_TIMEOUT_S = 20.0


def check_hosts(
    hosts: int, kill_host: int | None = None, *, secured: bool = False, sentinel: bool = False
) -> None:
    """Refuse a host count, a host to kill or a Redis that cannot be (before anything starts).

    Raises:
        ValueError: naming the valid range.
    """
    if not 1 <= hosts <= MAX_HOSTS:
        raise ValueError(f"--hosts must be within 1..{MAX_HOSTS}, got {hosts}")
    if kill_host is not None:
        if hosts < 2:
            raise ValueError("--kill-host needs at least --hosts 2 (another host must finish the jobs)")
        if not 1 <= kill_host <= hosts:
            raise ValueError(f"--kill-host must name a host within 1..{hosts}, got {kill_host}")
    if secured and sentinel:
        raise ValueError(
            "--secure-redis and --sentinel cannot be combined yet (the Sentinels speak no TLS here)"
        )
    if os.geteuid() != 0:
        raise ValueError("a multi-host fleet makes network namespaces: run it as root")


def _claim_run() -> int:
    """A run number whose folder, namespaces and addresses nobody uses; its folder made (the claim)."""
    in_use = netns.addresses_in_use()
    taken = {n.split("-")[1] for n in netns.namespaces()}
    for run in random.sample(range(1, 251), 250):
        if str(run) in taken or f"{SUBNET.format(run=run)}." in in_use:
            continue
        try:
            (BASE / f"sfh-{run}").mkdir(mode=0o755)
        except FileExistsError:
            continue
        return run
    raise RuntimeError("no free multi-host run number (run `sandfleet fleet down`)")


class HostFleet(LocalFleet):
    """``hosts`` hosts with one worker each, on a Redis in the control namespace. A context manager.

    Args:
        hosts: how many (1..MAX_HOSTS).
        config: each host's worker (``config.workers`` is ignored: one per host).
        images: loaded into every engine (the machine's engine must have them).
        secured: Redis speaks TLS only and knows only the ACL users of deploy/redis-acl.conf; the
            workers connect as ``worker``, :attr:`settings` (the driver) as ``producer``,
            :attr:`redis_url` is the harness's ``fleet-admin`` (SCALING.md §4a, issue 24 point 4).
        sentinel: Redis is a primary, a replica and three Sentinels (quorum 2) in the control
            namespace; workers and driver use the ``sentinel://`` URL; :meth:`kill_redis_primary`.
        clocks: a wall-clock offset per host for its worker (libfaketime's ``FAKETIME`` form,
            ``{2: "+30s"}``): sandfleet/fleet/skewed_clock.py.
        egress: each host runs network "restricted" with its own egress gateway (Docker network,
            host rules, Squid) in its namespace: :meth:`egress_env`. The test or operator adds the
            proxy's hosts file, allowed destinations and the policy through ``config.env``.
    """

    def __init__(
        self,
        hosts: int,
        config: FleetConfig | None = None,
        images: tuple[str, ...] = (),
        *,
        secured: bool = False,
        sentinel: bool = False,
        clocks: dict[int, str] | None = None,
        egress: bool = False,
    ) -> None:
        check_hosts(hosts, secured=secured, sentinel=sentinel)
        self.clocks = check_clocks(clocks or {}, hosts)
        self.egress = egress
        self.run = _claim_run()
        self.base = BASE / f"sfh-{self.run}"
        self.control = f"sfh-{self.run}-c"
        net = SUBNET.format(run=self.run)
        self.security = RedisSecurity(self.base / "tls", f"{net}.1") if secured else None
        self.sentinel = (
            SentinelRedis(
                self.base / "control" / "sentinel",
                SentinelPlacement(f"{net}.1", SENTINEL_PORTS, tuple(netns.enter(self.control))),
            )
            if sentinel
            else None
        )
        url = self.security.url(ADMIN, REDIS_PORT) if self.security else f"redis://{net}.1:{REDIS_PORT}/0"
        super().__init__(config, self.base, redis_url=self.sentinel.url if self.sentinel else url)
        self.hosts = hosts
        self.images = list(images or (DEFAULT_IMAGE,))
        self.engines = {
            i: HostEngine(self.namespace(i), self.base / f"h{i}" / "engine", self.uid(i))
            for i in range(1, hosts + 1)
        }
        self.host_workers: dict[int, WorkerProcess] = {}
        self._redis_process: subprocess.Popen[bytes] | None = None
        self._stopped = False
        (self.base / "owner.pid").write_text(str(os.getpid()))
        atexit.register(self.stop)

    def namespace(self, host: int) -> str:
        return f"sfh-{self.run}-{host}"

    def uid(self, host: int) -> int:
        return HOST_UID_BASE + 100 * self.run + host

    def role_settings(self, role: str) -> Settings:
        """Settings of a client of this fleet's Redis as ``role`` (secured: its own ACL user)."""
        if self.security is None:
            return Settings(redis_url=self.redis_url, key_prefix=self.key_prefix)
        url = self.security.url(role, REDIS_PORT)
        return Settings(redis_url=url, redis_ca_file=str(self.security.ca), key_prefix=self.key_prefix)

    @property
    def settings(self) -> Settings:
        """The driver's: a producer (secured: the ``producer`` user, over TLS)."""
        return self.role_settings("producer")

    def worker_env(self, **extra: str) -> dict[str, str]:
        env = super().worker_env(**extra)
        if self.security is not None:
            worker = self.role_settings("worker")
            env["SANDFLEET_REDIS_URL"] = worker.redis_url
            env["SANDFLEET_REDIS_CA_FILE"] = str(worker.redis_ca_file)
        return env

    @property
    def service_address(self) -> str:
        """A second address of the control namespace's bridge, for a service restricted sandboxes may
        reach (``egress``): the one internal destination each host's proxy is allowed (Redis's is not)."""
        return f"{SUBNET.format(run=self.run)}.2"

    @property
    def egress_hosts_file(self) -> Path:
        """The hosts file every host's proxy resolves names from (read when the proxy starts, at a
        host's first restricted job): a test writes its ``.test`` names there."""
        return self.base / "egress-hosts"

    def egress_env(self, host: int) -> dict[str, str]:
        """The host's own egress gateway: its proxy's folder (root's, 0755: Squid's user reads it),
        a subnet inside its namespace (network and bridge names may repeat across hosts), the
        service address as its one allowed internal destination, and DNS asked of the control
        namespace only (nothing listens there: names come from :attr:`egress_hosts_file`)."""
        state = self.base / f"h{host}" / "egress"
        state.mkdir(mode=0o755, exist_ok=True)
        if not self.egress_hosts_file.exists():
            self.egress_hosts_file.touch(mode=0o644)
        return {
            "SANDFLEET_EGRESS_HOSTS_FILE": str(self.egress_hosts_file),
            "SANDFLEET_EGRESS_STATE_DIR": str(state),
            "SANDFLEET_EGRESS_SUBNET": EGRESS_SUBNET.format(host=host),
            "SANDFLEET_EGRESS_ALLOW_DESTINATIONS": f"{self.service_address}/32",
            "SANDFLEET_EGRESS_DNS_SERVERS": f"{SUBNET.format(run=self.run)}.1",
        }

    def link(self, host: int) -> str:
        """The control side of the host's veth (down = the host is cut off)."""
        return f"sfh{self.run}c{host}"

    # -- starting -----------------------------------------------------------------------------------

    def start(self) -> None:
        """The network, Redis, the engines (images loaded), one worker per host; waits until all consume."""
        self.prepare()
        for folder in (self.data_dir, self.scripts_dir):
            folder.chmod(0o755)
        self._start_network()
        if self.security is not None:
            self.security.create()
        self._start_redis()
        tarball = cached_image_tarball(self.images)
        for engine in self.engines.values():
            engine.start()
        with ThreadPoolExecutor(max_workers=self.hosts) as pool:
            list(pool.map(lambda e: e.load_images(tarball), self.engines.values()))
        for host in self.engines:
            self.start_host_worker(host, wait=False)
        self.wait_ready()

    def _start_network(self) -> None:
        net = SUBNET.format(run=self.run)
        netns.add_namespace(self.control)
        netns.bridge(self.control, BRIDGE, f"{net}.1/24")
        if self.egress:
            netns.address(self.control, BRIDGE, f"{self.service_address}/24")
        root, root_peer = f"sfh{self.run}r", f"sfh{self.run}rc"
        netns.veth(root_peer, self.control, root, None)
        netns.attach(self.control, root_peer, BRIDGE)
        netns.address(None, root, f"{net}.254/24")
        for host in self.engines:
            name = self.namespace(host)
            netns.add_namespace(name)
            inside = f"sfh{self.run}h{host}"
            netns.veth(inside, name, self.link(host), self.control)
            netns.attach(self.control, self.link(host), BRIDGE)
            netns.address(name, inside, f"{net}.{10 + host}/24")

    def _start_redis(self) -> None:
        folder = self.base / "control"
        folder.mkdir(exist_ok=True)
        if self.sentinel is not None:
            self.sentinel.start()  # waits until the replica syncs and each Sentinel sees the others
            return
        bind = SUBNET.format(run=self.run) + ".1"
        ports = self.security.server_args(REDIS_PORT) if self.security else ["--port", str(REDIS_PORT)]
        cmd = [*netns.enter(self.control), "redis-server", "--bind", bind, *ports]
        cmd += ["--dir", str(folder), "--protected-mode", "no", *NO_PERSISTENCE]
        log = open(folder / "redis.log", "ab")  # noqa: SIM115 - the child holds it
        try:
            self._redis_process = subprocess.Popen(
                cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )
        finally:
            log.close()
        ca = str(self.security.ca) if self.security else None
        client = connect(self.redis_url, Settings(redis_ca_file=ca), socket_connect_timeout=0.5)
        try:
            for _ in range(int(REDIS_READY_TIMEOUT_S / 0.1)):
                try:
                    if client.ping():
                        return
                except redis.ConnectionError:
                    if self._redis_process.poll() is not None:
                        break
                time.sleep(0.1)
        finally:
            client.close()
        raise RuntimeError(
            f"redis-server in {self.control} did not answer:\n{(folder / 'redis.log').read_text()}"
        )

    def start_host_worker(self, host: int, *, wait: bool = True) -> WorkerProcess:
        """The host's worker (again, after a kill): its engine, its own user and folders."""
        home = self.base / f"h{host}" / "home"
        for folder in (home, home / "state"):
            folder.mkdir(parents=True, exist_ok=True, mode=0o700)
            os.chown(folder, self.uid(host), self.uid(host))
            folder.chmod(0o770)
        restarts = sum(1 for w in self.workers if w.name.startswith(f"h{host}-"))
        env = {
            "DOCKER_HOST": self.engines[host].url,
            "HOME": str(home),
            "SANDFLEET_WORKER_STATE_DIR": str(home / "state"),
            **(skewed_clock_env(self.clocks[host]) if host in self.clocks else {}),
            **(self.egress_env(host) if self.egress else {}),
        }
        worker = self.start_worker(f"h{host}-{self.token}-{restarts}", env=env, wait=wait)
        self.host_workers[host] = worker
        return worker

    def worker_command(self, name: str, concurrency: int, sandboxes: int) -> list[str]:
        """In the host's namespace, as the host's user; the ``-c`` code names the host's folder, so
        :func:`clean_leftovers` finds the process by its command line."""
        host = int(name[1:].split("-")[0])
        command = super().worker_command(name, concurrency, sandboxes)
        code = f"{SLEEP_WITHOUT_ABSTIME}; {SANDFLEET_ARGV[2]}" if host in self.clocks else SANDFLEET_ARGV[2]
        command[2] = f"{code}  # sandfleet host {self.base / f'h{host}'}/"
        return self.as_host(host, command)

    def as_host(self, host: int, command: list[str]) -> list[str]:
        """``command`` as the host's processes run: in its namespace, its group, no capabilities."""
        caps = EGRESS_CAPABILITIES if self.egress else NO_CAPABILITIES
        setpriv = ["setpriv", f"--regid={self.uid(host)}", "--clear-groups", *caps, "--"]
        hide = ["unshare", "--mount", "--propagation=private", "--", "sh", "-c", HIDE_MACHINE_SOCKET, "sh"]
        return [*netns.enter(self.namespace(host)), *hide, *setpriv, *command]

    # -- faults -------------------------------------------------------------------------------------

    def kill_host(self, host: int) -> None:
        """The host is lost: its worker, engine, containerd, shims and containers SIGKILLed at once."""
        worker = self.host_workers[host]
        engine = self.engines[host]
        pids = engine.processes() | set(netns.processes_mentioning(f"{self.base / f'h{host}'}/"))
        netns.kill_all(pids | {worker.process.pid})
        worker.process.wait()
        engine.kill()

    def restore_host(self, host: int, *, wait: bool = True) -> WorkerProcess:
        """The host comes back: its engine restarted (stale pidfiles removed), a new worker."""
        self.engines[host].start()
        return self.start_host_worker(host, wait=wait)

    def kill_redis_primary(self) -> None:
        """SIGKILL the Redis primary (``sentinel`` fleets): the Sentinels promote the replica."""
        if self.sentinel is None:
            raise RuntimeError("kill_redis_primary needs a fleet made with sentinel=True")
        self.sentinel.primary.stop(kill=True)

    def partition(self, host: int, cut: bool = True) -> None:
        """Cut the host off the control namespace (its veth down), or join it again."""
        netns.set_link(self.control, self.link(host), up=not cut)

    # -- stopping -----------------------------------------------------------------------------------

    def stop(self) -> None:
        """Workers (warm shutdown), engines, Redis, namespaces, folder: all of it, once."""
        if self._stopped:
            return
        self._stopped = True
        atexit.unregister(self.stop)
        if self.control in netns.namespaces():  # a partitioned worker must reach Redis to stop warm
            for host in self.engines:
                try:
                    netns.set_link(self.control, self.link(host), up=True)
                except netns.NamespaceError:  # a start that failed before making it
                    pass
        try:
            super().stop()
        finally:
            for engine in self.engines.values():
                engine.stop()
            if self._redis_process is not None and self._redis_process.poll() is None:
                self._redis_process.terminate()
                self._redis_process.wait(timeout=10)
            if self.sentinel is not None:
                self.sentinel.stop()
            clean_run(self.run)


def clean_run(run: int) -> None:
    """Remove everything of run ``run``: processes, mounts, cgroups, namespaces, links, its folder."""
    base = BASE / f"sfh-{run}"
    netns.kill_all(netns.processes_mentioning(f"{base}/"))
    names = [n for n in netns.namespaces() if n.startswith(f"sfh-{run}-")]
    for name in names:  # the control namespace's Redis renames its process title: found by namespace
        netns.kill_all(netns.cgroup_pids(name) | netns.processes_in(name))
    netns.unmount_under(base)
    for name in names:
        netns.delete_namespace(name)
        netns.remove_cgroup(name)
    for link in netns.root_links(f"sfh{run}r"):
        netns.ip("link", "delete", link, check=False)
    shutil.rmtree(base, ignore_errors=True)


def clean_leftovers(everything: bool = False) -> list[int]:
    """``sandfleet fleet down``: remove the runs whose owner process is gone (all with ``everything``).

    Returns the run numbers removed.
    """
    runs = {int(p.name.split("-")[1]) for p in BASE.glob("sfh-*") if p.name.split("-")[1].isdigit()}
    runs |= {int(n.split("-")[1]) for n in netns.namespaces() if n.split("-")[1].isdigit()}
    removed = []
    for run in sorted(runs):
        owner = BASE / f"sfh-{run}" / "owner.pid"
        if not everything and owner.exists() and _alive(int(owner.read_text() or 0)):
            continue
        clean_run(run)
        removed.append(run)
    return removed


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return pid > 0
