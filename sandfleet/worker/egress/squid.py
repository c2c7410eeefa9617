"""The egress proxy: one Squid per worker host and egress network, started and checked from here.

Why Squid (Debian's ``squid-openssl``): a proxy maintained for decades with security updates from
the distribution, that checks the CONNECT target's name (an external ACL, helper.py) and, with
``ssl_bump peek`` at step 1 and ``splice`` at step 2, reads the TLS ClientHello's server name
without decrypting anything, so a name that differs from the CONNECT target is refused. It resolves
names itself (``hosts_file`` first, then DNS), so a sandbox needs no DNS. Nothing is cached.
The ``ssl-bump`` port needs a certificate, made here and never used to sign anything (no ``bump``).
After the name, the destination: a name whose answer holds an internal address is refused
(destinations.py); Squid marks its own connections so that the host's kernel refuses them too.

The proxy is shared by every worker of the host: ``ensure`` reuses one that runs with the same
configuration, starts one otherwise, and fails closed (EgressError) when it cannot.
"""

from __future__ import annotations

import hashlib
import os
import pwd
import shutil
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from sandfleet.core import allowlist
from sandfleet.core.errors import SandboxError
from sandfleet.worker.egress import destinations
from sandfleet.worker.egress.destinations import DeniedRanges

SQUID_USER = "proxy"
START_TIMEOUT_S = 20.0
HELPER_FILES = {  # copied into the proxy's folder, which Squid's user can read
    "helper.py": Path(__file__).with_name("helper.py"),
    "allowlist.py": Path(allowlist.__file__),
    "destinations.py": Path(destinations.__file__),
}
ERROR_PAGE = "ERR_SANDFLEET_DENIED"
SYSTEM_PYTHON = "/usr/bin/python3"
LOG_DAEMON = "log-daemon"  # the script Squid runs as its logfile_daemon (the helper in "log" mode)
CAP_NET_ADMIN = 12  # what setsockopt(SO_MARK) needs: Squid keeps it when tcp_outgoing_mark is set


class EgressError(SandboxError):
    """The egress proxy or its rules cannot be set up or verified: the sandbox does not start."""


@dataclass(frozen=True)
class ProxyConfig:
    """Where the proxy listens and keeps its files. ``hosts_file`` is read before DNS (the servers
    ``dns_servers``, or the host's resolv.conf); ``denied``: the destinations it refuses; ``mark``:
    the netfilter mark of its connections (the host's destination filter matches it, network.py);
    ``extra``: directives appended as they are (benchmarks/egress.py compares settings with it)."""

    listen_ip: str
    port: int
    state_dir: Path
    hosts_file: str = "/etc/hosts"
    denied: DeniedRanges = field(default_factory=DeniedRanges.build)
    dns_servers: tuple[str, ...] = ()
    mark: int = 0
    extra: tuple[str, ...] = ()

    def render(self) -> str:
        """The squid.conf of this proxy."""
        state = self.state_dir
        helper = f"{SYSTEM_PYTHON} -I -S {state}/helper.py {state}"
        denied = self.denied
        return "\n".join(
            [
                "# Written by sandfleet (sandfleet/worker/egress/squid.py); rewritten at each start.",
                f"http_port {self.listen_ip}:{self.port} ssl-bump tls-cert={state}/proxy.pem "
                "generate-host-certificates=off",
                f"pid_filename {state}/squid.pid",
                f"cache_log {state}/cache.log",
                f"access_log stdio:{state}/access.log squid",
                f"coredump_dir {state}",
                f"error_directory {state}/errors",
                f"hosts_file {self.hosts_file}",
                *([f"dns_nameservers {' '.join(self.dns_servers)}"] if self.dns_servers else []),
                *([f"tcp_outgoing_mark {self.mark:#x} all"] if self.mark else []),
                # Every transaction to the helper in "log" mode: it records a connection to a refused
                # range that the host's filter stopped (the answer changed after the ACL's check).
                f"logfile_daemon {state}/{LOG_DAEMON}",
                "logformat sf_outcome %>a %>rm %>rd %>rP %<a %err_code %>Hs",
                f"access_log daemon:{state}/outcomes sf_outcome",
                f"cache_effective_user {SQUID_USER}",
                "cache deny all",
                "cache_mem 0 MB",
                "memory_pools off",
                "pinger_enable off",
                "via off",
                "forwarded_for delete",
                "httpd_suppress_version_string on",
                "visible_hostname sandfleet-egress",
                "shutdown_lifetime 0 seconds",
                "connect_timeout 10 seconds",
                "dns_timeout 10 seconds",
                "logfile_rotate 0",
                # The helpers decide every request: no caching of their answers.
                "external_acl_type sf_request ttl=0 negative_ttl=0 cache=0 children-max=8 "
                f"children-startup=2 children-idle=1 %>a %>rm %>rd %>rP {helper} connect",
                "external_acl_type sf_tls ttl=0 negative_ttl=0 cache=0 children-max=8 "
                f"children-startup=2 children-idle=1 %>a %>rd %>rP %ssl::>sni {helper} sni",
                "external_acl_type sf_destination ttl=0 negative_ttl=0 cache=0 children-max=4 "
                f"children-startup=1 children-idle=1 %>a %>rm %>rd %>rP {helper} destination",
                "acl sf_request_ok external sf_request",
                "acl sf_tls_ok external sf_tls",
                *denied.squid_acls(),
                "acl step1 at_step SslBump1",
                "acl step2 at_step SslBump2",
                # A CONNECT is decided at SslBump step 1: a refusal there closes the connection
                # before its "200". Refused by http_access, Squid would bump it (with proxy.pem) to
                # show its error page inside TLS. Plain HTTP is decided by http_access (a 403 page).
                "acl CONNECT method CONNECT",
                # The destination after the name: a name off the list is never even resolved.
                f"deny_info {ERROR_PAGE} sf_request_ok",
                *[f"deny_info {ERROR_PAGE} {acl}" for acl in denied.squid_refusal_acls()],
                "http_access deny !CONNECT !sf_request_ok",
                *denied.squid_refusals("http_access deny !CONNECT"),
                "http_access allow all",
                "ssl_bump terminate step1 !sf_request_ok",
                *denied.squid_refusals("ssl_bump terminate step1"),
                "ssl_bump peek step1",
                "ssl_bump splice step2 sf_tls_ok",
                "ssl_bump terminate all",
                "on_unsupported_protocol respond all",
                *self.extra,
                "",
            ]
        )

    def digest(self) -> str:
        return hashlib.sha256(self.render().encode()).hexdigest()[:16]


def _chown(path: Path, user: str = SQUID_USER) -> None:
    entry = pwd.getpwnam(user)
    os.chown(path, entry.pw_uid, entry.pw_gid)


def prepare_state(config: ProxyConfig) -> Path:
    """Write the proxy's folder: config, helper, certificate, error page, clients/ and denials/."""
    state = config.state_dir
    for sub in ("", "clients", "denials", "errors"):
        (state / sub).mkdir(parents=True, exist_ok=True)
        os.chmod(state / sub, 0o755)
    _chown(state)
    _chown(state / "denials")
    for name, source in HELPER_FILES.items():
        shutil.copyfile(source, state / name)
    (state / "errors" / ERROR_PAGE).write_text(
        "sandfleet egress: %o (request %R)\n"
    )  # %o: the helper's message, %R: the request line
    pem = state / "proxy.pem"
    if not pem.exists():
        done = subprocess.run(
            ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "3650", "-subj",
             "/CN=sandfleet egress proxy (never used to sign)", "-keyout", str(pem), "-out", str(pem)],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        if done.returncode != 0:
            raise EgressError(f"cannot make the egress proxy's certificate: {done.stderr.strip()}")
        os.chmod(pem, 0o640)
        os.chown(pem, 0, pwd.getpwnam(SQUID_USER).pw_gid)
    (state / "destinations.json").write_text(config.denied.to_json())
    daemon = state / LOG_DAEMON  # Squid runs logfile_daemon with no arguments of ours
    daemon.write_text(f'#!/bin/sh\nexec {SYSTEM_PYTHON} -I -S {state}/helper.py {state} log "$@"\n')
    os.chmod(daemon, 0o755)
    (state / "squid.conf").write_text(config.render())
    (state / "squid.conf.digest").write_text(config.digest())
    return state


def squid_binary() -> str:
    path = shutil.which("squid") or ("/usr/sbin/squid" if os.path.exists("/usr/sbin/squid") else None)
    if path is None:
        raise EgressError(
            "network 'restricted' needs Squid on the worker host: run deploy/bootstrap.sh "
            "(apt-get install squid-openssl)"
        )
    return path


def running_pid(state: Path) -> int | None:
    """The pid of the proxy of this folder if it is alive and is squid."""
    try:
        pid = int((state / "squid.pid").read_text().strip())
        comm = Path(f"/proc/{pid}/comm").read_text().strip()
    except (OSError, ValueError):
        return None
    return pid if comm.startswith("squid") else None


def can_mark(pid: int) -> bool:
    """Whether process ``pid`` holds CAP_NET_ADMIN, without which Squid leaves its connections
    unmarked (it logs a warning and goes on) and the host's destination filter would not see them."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    effective = next((line.split()[1] for line in status.splitlines() if line.startswith("CapEff:")), "0")
    return bool(int(effective, 16) >> CAP_NET_ADMIN & 1)


def answers(ip: str, port: int, timeout: float = 1.0) -> bool:
    try:
        with socket.create_connection((ip, port), timeout=timeout):
            return True
    except OSError:
        return False


# The proxies this process started, kept so that the Popen object is not collected while Squid runs
# (its __del__ would warn, and only a kept object can reap Squid when it is stopped). By state folder.
_started: dict[Path, subprocess.Popen[bytes]] = {}


def ensure_proxy(config: ProxyConfig) -> int:
    """A running proxy of this configuration (started if needed); returns its pid.

    Raises:
        EgressError: Squid is missing, its configuration does not parse, or it did not start.
    """
    state = config.state_dir
    pid = running_pid(state)
    digest_file = state / "squid.conf.digest"
    if pid and digest_file.exists() and digest_file.read_text() == config.digest():
        if answers(config.listen_ip, config.port) and (not config.mark or can_mark(pid)):
            return pid
    if pid:
        stop_proxy(config)
    binary = squid_binary()
    prepare_state(config)
    conf = str(state / "squid.conf")
    parsed = subprocess.run([binary, "-k", "parse", "-f", conf], capture_output=True, text=True, timeout=30)
    if parsed.returncode != 0:
        raise EgressError(f"the egress proxy's configuration does not parse: {parsed.stderr.strip()[-800:]}")
    log = open(state / "squid.out", "ab")  # noqa: SIM115 - handed to the child
    try:
        process = subprocess.Popen(
            [binary, "-N", "-f", conf], stdin=subprocess.DEVNULL, stdout=log, stderr=log,
            start_new_session=True, close_fds=True,
        )  # fmt: skip
    finally:
        log.close()
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            logs = [state / "squid.out", state / "cache.log"]
            tail = " ".join(p.read_text(errors="replace")[-600:] for p in logs if p.exists())
            raise EgressError(f"the egress proxy exited at start (code {process.returncode}): {tail}")
        if answers(config.listen_ip, config.port, timeout=0.2) and running_pid(state):
            _started[state] = process
            if config.mark and not can_mark(process.pid):
                stop_proxy(config)
                raise EgressError(
                    "the egress proxy runs without CAP_NET_ADMIN: it cannot mark its connections for the "
                    "host's destination filter (is the worker root? is Squid built with libcap?)"
                )
            return process.pid
        time.sleep(0.05)
    process.kill()
    process.wait()
    raise EgressError(
        f"the egress proxy did not listen on {config.listen_ip}:{config.port} within {START_TIMEOUT_S:g} s"
    )


def stop_proxy(config: ProxyConfig, timeout: float = 10.0) -> None:
    """Stop the proxy of this folder, if one runs."""
    pid = running_pid(config.state_dir)
    if pid is None:
        return
    try:
        os.kill(pid, 15)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and running_pid(config.state_dir) == pid:
        try:
            os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            pass
        time.sleep(0.05)
    if running_pid(config.state_dir) == pid:
        os.kill(pid, 9)
    started = _started.pop(config.state_dir, None)
    if started is not None and started.pid == pid:
        started.wait(timeout)


if __name__ == "__main__":  # pragma: no cover - print a configuration for reading
    print(ProxyConfig(sys.argv[1], int(sys.argv[2]), Path(sys.argv[3])).render())
