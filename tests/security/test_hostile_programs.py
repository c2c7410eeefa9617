"""Hostile programs: each case runs a real attack inside a real sandbox, under runc and under runsc.

One table of cases. Each program tries its attack, prints what happened as ``RESULT: {json}``, and its
check decides whether it was blocked by the mechanism the row names: each attempt must fail with the
errno (or the error text) expected of that mechanism, so an attempt that failed for another reason
(a NameError in the attack, a tool that is missing) does not count as refused. The check's verdict
is what the results file publishes, and the test asserts it. Every run ends with the leftover check
of conftest.py: the container is gone and no host process serves it any more. Outcomes go to
``artifacts/security-results.json`` (see SECURITY.md).

The network cases use network "none", and aim only at names under ``.invalid`` and at addresses this
machine owns: the host's own, and the ones this test run holds for "the Internet" and "a metadata
service" (tests/owned_targets.py). Had a refusal failed, the packet would have arrived there, and
the network case also asserts that nothing did.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest

from sandfleet.worker.sandbox.container import AGENT_KILLED

from .helpers import REPO, free_port, percentile, program, record, vm_hwm_kib

SECRET = "sk-sandfleet-fake-worker-secret-4242"

PRELUDE = program(
    r"""
    import ctypes, errno, json, os, socket, subprocess, sys, time
    report = {}
    libc = ctypes.CDLL(None, use_errno=True)


    def attempt(name, action):
        try:
            report[name] = {"ok": True, "value": action()}
        except socket.gaierror as e:
            report[name] = {"ok": False, "errno": "EAI", "error": str(e)}
        except OSError as e:
            report[name] = {"ok": False, "errno": errno.errorcode.get(e.errno, str(e.errno)), "error": str(e)}
        except Exception as e:  # not refused by the system: the attack itself broke
            report[name] = {"ok": False, "errno": None, "exception": f"{type(e).__name__}: {e}"}


    def syscall(nr, *args):
        ret = libc.syscall(nr, *args)
        if ret < 0:
            err = ctypes.get_errno()
            raise OSError(err, os.strerror(err))
        return ret


    def done():
        print("RESULT: " + json.dumps(report))
    """
)


@dataclass(frozen=True)
class Case:
    name: str
    source: str
    check: Callable[[Any, str, dict[str, Any]], tuple[bool, Any]]
    sandbox: dict[str, Any] = field(default_factory=dict)
    settings: dict[str, Any] = field(default_factory=dict)


def payload(run: Any) -> dict[str, Any]:
    assert run.result_found and isinstance(run.result, dict), (
        run.exit_code,
        run.error,
        run.stdout[-500:],
        run.stderr[-1000:],
        run.timings,
    )
    return run.result


@dataclass(frozen=True)
class Refused:
    """How one attempt must fail: with one of ``errnos`` and, if ``says`` is set, an error text
    holding it. The errno None is a probe that found nothing (no error at all)."""

    errnos: frozenset[str | None]
    says: str | None = None

    def matches(self, outcome: dict[str, Any]) -> bool:
        return (
            outcome.get("ok") is False
            and "exception" not in outcome  # the attack broke: not a refusal
            and outcome.get("errno") in self.errnos
            and (self.says is None or self.says in str(outcome.get("error", "")))
        )

    def __str__(self) -> str:
        names = "/".join("nothing found" if e is None else e for e in sorted(self.errnos, key=str))
        return names + (f" saying {self.says!r}" if self.says else "")


def refused(*errnos: str, says: str | None = None) -> Refused:
    return Refused(frozenset(errnos), says)


ABSENT = Refused(frozenset({None}))  # a probe that looked and found nothing
# Expected refusals: one Refused for both runtimes, or a dict by runtime where they differ.
Expected = dict[str, Refused | dict[str, Refused]]


def refused_as(report: dict[str, Any], expected: Expected, runtime: str) -> tuple[bool, dict[str, Any]]:
    """Whether every attempt failed as ``expected`` names (and every expected attempt was made):
    (verdict, {attempt: errno or error} plus what did not match)."""
    got: dict[str, Any] = {}
    wrong: dict[str, str] = {}
    for name in sorted(set(report) | set(expected)):
        want = expected.get(name)
        outcome = report.get(name)
        if want is None:
            wrong[name] = f"attempted, but no refusal is expected of it: {outcome}"
            continue
        if outcome is None:
            wrong[name] = "not attempted"
            continue
        if isinstance(want, dict):
            want = want[runtime]
        got[name] = outcome.get("errno") or outcome.get("exception") or outcome.get("error")
        if not want.matches(outcome):
            wrong[name] = f"expected {want}, got {outcome}"
    return not wrong, {"refused": got, **({"not as expected": wrong} if wrong else {})}


def verdict(detail: Any, **held: bool) -> tuple[bool, Any]:
    """(all conditions held, detail, plus the names of those that did not)."""
    failed = [name for name, ok in held.items() if not ok]
    return not failed, detail if not failed else {"failed": failed, "detail": detail}


# ---- the cases ---------------------------------------------------------------------------------

FORK_BOMB = PRELUDE + program(
    """
    forked, err = 0, None
    try:
        while True:
            if os.fork() == 0:
                time.sleep(60)
                os._exit(0)
            forked += 1
    except OSError as e:
        err = errno.errorcode.get(e.errno)
    report["fork_bomb"] = {"ok": False, "errno": err, "forked": forked}
    done()
    """
)


def check_fork_bomb(run: Any, runtime: str, ctx: dict[str, Any]) -> tuple[bool, Any]:
    # runc: the pids cgroup refuses; gVisor: its kernel's RLIMIT_NPROC does (sandfleet/worker/sandbox/docker/spec.py).
    outcome = payload(run)["fork_bomb"]
    return verdict(
        f"fork stopped with {outcome['errno']} after {outcome['forked']} children (pids_limit 256)",
        refused_with_eagain=outcome["errno"] == "EAGAIN",
        below_the_pids_limit=outcome["forked"] < 256,  # pids_limit 256 (the agent and the program count too)
    )


MEMORY_BOMB = program(
    """
    chunks = []
    while True:
        chunks.append(b"\\x01" * (16 << 20))
    """
)


def check_memory_bomb(run: Any, runtime: str, ctx: dict[str, Any]) -> tuple[bool, Any]:
    # runc: the program is OOM-killed; gVisor: the whole sandbox is, and the host reads Docker's OOMKilled.
    failure = run.failure() or ""
    return verdict(
        {"exit_code": run.exit_code, "oom_killed": run.oom_killed, "failure": failure},
        exit_137=run.exit_code == 137,
        oom_killed=run.oom_killed,
        memory_limit_hit="memory" in run.limits_hit,
        says_out_of_memory=failure == "the program ran out of memory (exit code 137)",
    )


FILL_DISKS = PRELUDE + program(
    """
    def fill(path):
        written = 0
        block = b"\\0" * (1 << 20)
        with open(path, "wb") as f:
            try:
                while written < (2 << 30):
                    f.write(block)
                    f.flush()
                    written += 1
            except OSError as e:
                return {"ok": False, "errno": errno.errorcode.get(e.errno), "mib": written}
        return {"ok": True, "mib": written}

    report["workspace"] = fill("/workspace/fill.bin")
    report["tmp"] = fill("/tmp/fill.bin")
    report["var_tmp"] = fill("/var/tmp/fill.bin")
    done()
    """
)


def host_free_bytes() -> int:
    st = os.statvfs("/")
    return st.f_bavail * st.f_frsize


def check_fill(run: Any, runtime: str, ctx: dict[str, Any]) -> tuple[bool, Any]:
    report = payload(run)
    held = {}
    for where, limit in (("workspace", 64), ("tmp", 64), ("var_tmp", 64)):
        outcome = report[where]
        held[f"{where}_enospc_within_{limit}_mib"] = (
            not outcome["ok"] and outcome["errno"] == "ENOSPC" and outcome["mib"] <= limit
        )
    written = sum(o["mib"] for o in report.values()) << 20
    drop = ctx["free_before"] - host_free_bytes()
    # Other people share this disk: allow noise, but the sandbox's writes must not have landed on it.
    held["host_disk_untouched"] = drop < written
    detail = {
        "enospc_after_mib": {k: v["mib"] for k, v in report.items()},
        "host_free_drop_mib": round(drop / 2**20, 1),
    }
    return verdict(detail, **held)


WRITE_ROOT = PRELUDE + program(
    """
    def write(path):
        with open(path, "w") as f:
            f.write("x")
        return "written"

    attempt("create /evil", lambda: write("/evil"))
    attempt("append /etc/passwd", lambda: open("/etc/passwd", "a").write("evil:x:0:0::/:/bin/sh\\n"))
    attempt("create /usr/bin/evil", lambda: write("/usr/bin/evil"))
    attempt("mkdir /opt/evil", lambda: os.mkdir("/opt/evil"))
    attempt("chmod /etc/shadow", lambda: os.chmod("/etc/shadow", 0o777))
    done()
    """
)


# The root is mounted read-only (EROFS) and its files are root's, not the sandbox user's (EACCES; EPERM
# for chmod). gVisor checks the user's permission before the mount's read-only flag.
ROOT_WRITES: Expected = {
    "create /evil": {"runc": refused("EROFS"), "runsc": refused("EACCES")},
    "append /etc/passwd": refused("EACCES"),
    "create /usr/bin/evil": {"runc": refused("EROFS"), "runsc": refused("EACCES")},
    "mkdir /opt/evil": refused("EROFS"),
    "chmod /etc/shadow": {"runc": refused("EROFS"), "runsc": refused("EPERM")},
}


def check_root_writes(run: Any, runtime: str, ctx: dict[str, Any]) -> tuple[bool, Any]:
    return refused_as(payload(run), ROOT_WRITES, runtime)


ZOMBIES = PRELUDE + program(
    """
    def zombies():
        found = []
        for p in os.listdir("/proc"):
            if p.isdigit():
                try:
                    with open(f"/proc/{p}/stat") as f:
                        rest = f.read().rsplit(")", 1)[1].split()
                except OSError:
                    continue
                if rest[0] == "Z":
                    found.append((int(p), int(rest[1])))
        return found

    for _ in range(50):  # children that exit and are never waited for
        if os.fork() == 0:
            os._exit(0)
    time.sleep(0.5)
    own = len([z for z in zombies() if z[1] == os.getpid()])
    middle = os.fork()
    if middle == 0:  # grandchildren orphaned to init, which must reap them
        for _ in range(50):
            if os.fork() == 0:
                time.sleep(0.2)
                os._exit(0)
        os._exit(0)
    os.waitpid(middle, 0)
    time.sleep(1.5)
    report["own_zombies"] = own
    report["orphan_zombies_left"] = [z for z in zombies() if z[1] != os.getpid()]
    done()
    """
)


def check_zombies(run: Any, runtime: str, ctx: dict[str, Any]) -> tuple[bool, Any]:
    report = payload(run)
    return verdict(
        {
            "own_zombies_seen": report["own_zombies"],
            "orphans_left_unreaped": len(report["orphan_zombies_left"]),
        },
        exited_normally=run.exit_code == 0 and not run.timed_out,
        own_zombies_seen=report["own_zombies"] == 50,
        orphans_reaped=report["orphan_zombies_left"] == [],
    )


EMFILE = PRELUDE + program(
    """
    fds = []
    try:
        while True:
            fds.append(os.open("/dev/null", os.O_RDONLY))
    except OSError as e:
        report["open"] = {"ok": False, "errno": errno.errorcode.get(e.errno), "opened": len(fds)}
    done()
    """
)


def check_emfile(run: Any, runtime: str, ctx: dict[str, Any]) -> tuple[bool, Any]:
    outcome = payload(run)["open"]
    return verdict(
        f"{outcome['errno']} after {outcome['opened']} files (nofile 1024)",
        refused_with_emfile=outcome["errno"] == "EMFILE",
        below_nofile=outcome["opened"] < 1024,
    )


def network_source(targets: list[tuple[str, str, int]]) -> str:
    return PRELUDE + program(
        f"""
        def connect(host, port):
            with socket.create_connection((host, port), timeout=3):
                return "connected"

        attempt("dns getaddrinfo", lambda: socket.getaddrinfo("pypi.sandfleet.invalid", 443))
        attempt("dns gethostbyname", lambda: socket.gethostbyname("example.sandfleet.invalid"))
        for label, host, port in {targets!r}:
            attempt(label, lambda h=host, p=port: connect(h, p))
        report["interfaces"] = {{"ok": False, "errno": None, "error": str(socket.if_nameindex())}}
        done()
        """
    )


def network_refusals(targets: list[tuple[str, str, int]]) -> Expected:
    """Network none: no resolver is reachable (EAI_AGAIN: a resolver would have answered NXDOMAIN for
    .invalid), no route leaves (runc: ENETUNREACH, gVisor's netstack: EHOSTUNREACH), and on the
    sandbox's own loopback nothing listens (ECONNREFUSED)."""
    unreachable = {"runc": refused("ENETUNREACH"), "runsc": refused("EHOSTUNREACH")}
    no_resolver = refused("EAI", says="Temporary failure in name resolution")
    expected: Expected = {"dns getaddrinfo": no_resolver, "dns gethostbyname": no_resolver}
    for label, host, _port in targets:
        expected[label] = refused("ECONNREFUSED") if host == "127.0.0.1" else unreachable
    return expected


def network_check(
    targets: list[tuple[str, str, int]],
) -> Callable[[Any, str, dict[str, Any]], tuple[bool, Any]]:
    def check_network(run: Any, runtime: str, ctx: dict[str, Any]) -> tuple[bool, Any]:
        report = payload(run)
        interfaces = report.pop("interfaces")["error"]
        blocked, summary = refused_as(report, network_refusals(targets), runtime)
        summary["interfaces"] = interfaces
        summary["arrived at the owned targets"] = arrived = ctx["owned"].arrived_since(ctx["owned_mark"])
        return blocked and interfaces == "[(1, 'lo')]" and arrived == {}, summary  # only loopback

    return check_network


PROC_STATUS = PRELUDE + program(
    """
    fields = {}
    with open("/proc/self/status") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key in ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb", "NoNewPrivs", "Seccomp", "Uid"):
                fields[key] = value.split()
    report = fields
    done()
    """
)


def check_proc_status(run: Any, runtime: str, ctx: dict[str, Any]) -> tuple[bool, Any]:
    fields = payload(run)
    # runsc: gVisor's own /proc has no NoNewPrivs line; it is recorded as shown (its kernel is the
    # boundary, not seccomp).
    return verdict(
        {k: v[0] for k, v in fields.items() if v},
        no_effective_or_permitted_capability=int(fields["CapEff"][0], 16) == 0
        and int(fields["CapPrm"][0], 16) == 0,
        unprivileged_user=fields["Uid"][0] == "10001",
        no_new_privs_and_seccomp=runtime != "runc"
        or (fields["NoNewPrivs"] == ["1"] and fields["Seccomp"] == ["2"]),
    )


PRIVILEGED = PRELUDE + program(
    """
    def run(argv):
        done_ = subprocess.run(
            argv, stdin=subprocess.DEVNULL, capture_output=True, timeout=10, start_new_session=True
        )
        if done_.returncode == 0:
            return done_.stdout.decode(errors="replace")
        raise PermissionError(errno.EPERM, f"exit {done_.returncode}: {done_.stderr.decode(errors='replace')[:200]}")

    def tool(name, argv):
        import shutil
        if shutil.which(argv[0]) is None:
            report[name] = {"ok": False, "errno": None, "error": "not installed"}
        else:
            attempt(name, lambda: run(argv))

    tool("su root", ["su", "-c", "id", "root"])
    tool("sudo", ["sudo", "-n", "id"])
    tool("unshare -Ur", ["unshare", "-Ur", "true"])
    tool("mount tmpfs (binary)", ["mount", "-t", "tmpfs", "none", "/workspace"])
    def in_child(name, action):  # namespace changes stay in a child that reports and exits
        r, w = os.pipe()
        child = os.fork()
        if child == 0:
            attempt(name, action)
            os.write(w, json.dumps(report[name], default=str).encode())
            os._exit(0)
        os.waitpid(child, 0)
        report[name] = json.loads(os.read(r, 4096) or b'{"ok": false, "errno": null, "error": "child died"}')

    in_child("unshare(CLONE_NEWUSER)", lambda: syscall(272, 0x10000000))
    in_child("unshare(CLONE_NEWNS)", lambda: syscall(272, 0x00020000))
    in_child("mount(2) tmpfs", lambda: syscall(165, b"none", b"/workspace", b"tmpfs", 0, None))

    # ptrace, each attach from a child of its own that then exits (a tracer's exit detaches):
    # a sibling process (both children of this program), init (pid 1) and the agent (our parent).
    def attach_from_child(target):
        r, w = os.pipe()
        tracer = os.fork()
        if tracer == 0:
            ret = libc.ptrace(16, target, None, None)  # PTRACE_ATTACH
            os.write(w, json.dumps([ret, errno.errorcode.get(ctypes.get_errno())]).encode())
            os._exit(0)
        os.waitpid(tracer, 0)
        ret, err = json.loads(os.read(r, 100))
        return {"ok": ret == 0, "errno": None if ret == 0 else err}

    sibling = os.fork()
    if sibling == 0:
        time.sleep(30)
        os._exit(0)
    report["ptrace sibling"] = attach_from_child(sibling)
    os.kill(sibling, 9)
    report["ptrace init (pid 1)"] = attach_from_child(1)
    report["ptrace the agent (parent)"] = attach_from_child(os.getppid())
    attempt("keyctl(GET_KEYRING_ID)", lambda: syscall(250, 0, -3, 1))
    attempt("add_key", lambda: syscall(248, b"user", b"sf", b"x", 1, -3))
    attr = ctypes.create_string_buffer(bytes(__import__("struct").pack("<IIIII", 2, 4, 4, 1, 0)).ljust(128, b"\\0"))
    attempt("bpf(BPF_MAP_CREATE)", lambda: syscall(321, 0, attr, 128))
    params = ctypes.create_string_buffer(120)
    attempt("io_uring_setup", lambda: syscall(425, 8, params))
    attempt("init_module", lambda: syscall(175, None, 0, b""))
    attempt("finit_module", lambda: syscall(313, 0, b"", 0))
    attempt("delete_module", lambda: syscall(176, b"ext4", 0))
    done()
    """
)


NOT_INSTALLED = Refused(frozenset({None}), says="not installed")
# ptrace, io_uring, namespaces, mounts, keyrings, bpf and modules are refused with EPERM under both
# runtimes: Docker's profile and the agent's own seccomp filter stacked on it (syscall_filter.py). The
# tools fail as they say: su cannot authenticate (no password; its setuid bit does nothing under
# no-new-privileges), unshare(1) is refused by the kernel, mount(1) refuses a non-root user itself
# (the kernel's own refusal is the mount(2) row); sudo is not in the image.
PRIVILEGED_CALLS: Expected = {
    "su root": refused("EPERM", says="su: Authentication failure"),
    "sudo": NOT_INSTALLED,
    "unshare -Ur": refused("EPERM", says="unshare failed: Operation not permitted"),
    "mount tmpfs (binary)": refused("EPERM", says="must be superuser to use mount"),
    **{
        name: refused("EPERM")
        for name in (
            "unshare(CLONE_NEWUSER)",
            "unshare(CLONE_NEWNS)",
            "mount(2) tmpfs",
            "ptrace sibling",
            "ptrace init (pid 1)",
            "ptrace the agent (parent)",
            "keyctl(GET_KEYRING_ID)",
            "add_key",
            "bpf(BPF_MAP_CREATE)",
            "io_uring_setup",
            "init_module",
            "finit_module",
            "delete_module",
        )
    },
}


def check_privileged(run: Any, runtime: str, ctx: dict[str, Any]) -> tuple[bool, Any]:
    return refused_as(payload(run), PRIVILEGED_CALLS, runtime)


KERNEL_WRITES = PRELUDE + program(
    """
    import glob

    def write(path, text):
        with open(path, "w") as f:
            f.write(text)
        return "written"

    attempt("/proc/sys/kernel/core_pattern", lambda: write("/proc/sys/kernel/core_pattern", "|/tmp/x"))
    attempt("/proc/sys/vm/drop_caches", lambda: write("/proc/sys/vm/drop_caches", "3"))
    # These exist on some kernels and cgroup versions only: each one there is attempted.
    agents = glob.glob("/sys/fs/cgroup/*/release_agent") + glob.glob("/sys/fs/cgroup/release_agent")
    absent = []
    for path in ["/proc/sysrq-trigger", *(sorted(agents) or ["/sys/fs/cgroup/memory/release_agent"]),
                 "/sys/fs/cgroup/memory/memory.limit_in_bytes", "/sys/fs/cgroup/pids/pids.max",
                 "/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/pids.max",
                 "/sys/fs/cgroup/memory/cgroup.procs", "/sys/fs/cgroup/cgroup.procs",
                 "/sys/fs/cgroup/memory/notify_on_release"]:
        if os.path.exists(path):
            attempt(path, lambda p=path: write(p, "max" if "max" in p else "h" if "sysrq" in p else "/tmp/x"))
        else:
            absent.append(path)
    attempt("mount cgroup", lambda: syscall(165, b"cgroup", b"/workspace", b"cgroup", 0, b"memory"))
    print("RESULT: " + json.dumps({"attempts": report, "absent": absent}))
    """
)


def check_kernel_writes(run: Any, runtime: str, ctx: dict[str, Any]) -> tuple[bool, Any]:
    report = payload(run)
    attempts = report["attempts"]
    # runc: Docker mounts /proc/sys, /proc/sysrq-trigger and the cgroup files read-only (EROFS; open
    # "w" truncates, which asks for a writable mount first). gVisor: its /proc files are root's and
    # the sandbox user may not write them (EACCES), and it shows none of those cgroup files.
    read_only = {"runc": refused("EROFS"), "runsc": refused("EACCES")}
    expected: Expected = {
        "/proc/sys/kernel/core_pattern": read_only,
        "/proc/sys/vm/drop_caches": read_only,
        "mount cgroup": refused("EPERM"),
    }
    for path in attempts:
        if path.startswith(("/proc/sysrq-trigger", "/sys/fs/cgroup/")):
            expected[path] = read_only
    blocked, detail = refused_as(attempts, expected, runtime)
    return blocked, {**detail, "absent": report["absent"]}


def secrets_source(host_paths: list[str]) -> str:
    return PRELUDE + program(
        f"""
        secret = {SECRET!r}
        report["env has the secret"] = {{"ok": secret in json.dumps(dict(os.environ)), "errno": None}}
        leaked = []
        for pid in os.listdir("/proc"):
            if pid.isdigit():
                try:
                    with open(f"/proc/{{pid}}/environ", "rb") as f:
                        if secret.encode() in f.read():
                            leaked.append(pid)
                except OSError:
                    pass
        report["secret in /proc/*/environ"] = {{"ok": bool(leaked), "errno": None, "error": leaked}}
        with open("/proc/self/mountinfo") as f:
            points = [line.split()[4] for line in f]
        report["host folder mounted"] = {{
            "ok": any(pt.startswith(p) for pt in points for p in {host_paths!r} + ["/var/run", "/run/docker"]),
            "errno": None, "error": points}}
        for path in {host_paths!r} + ["/var/run/docker.sock", "/run/docker.sock", "/proc/1/root/var/run/docker.sock"]:
            report["exists " + path] = {{"ok": os.path.lexists(path), "errno": None}}

        def docker_socket():
            with socket.socket(socket.AF_UNIX) as s:
                s.settimeout(3)
                s.connect("/var/run/docker.sock")
                return "connected"

        attempt("connect docker.sock", docker_socket)
        done()
        """
    )


def check_secrets(run: Any, runtime: str, ctx: dict[str, Any]) -> tuple[bool, Any]:
    # Probes that look for the secret, host folders and the Docker socket and must find nothing; the
    # socket's connect fails as there is no such file (ENOENT).
    expected: Expected = {
        name: ABSENT for name in ("env has the secret", "secret in /proc/*/environ", "host folder mounted")
    }
    for path in [
        *ctx["host_paths"],
        "/var/run/docker.sock",
        "/run/docker.sock",
        "/proc/1/root/var/run/docker.sock",
    ]:
        expected["exists " + path] = ABSENT
    expected["connect docker.sock"] = refused("ENOENT")
    return refused_as(payload(run), expected, runtime)


def cases(ctx: dict[str, Any]) -> list[Case]:
    targets = [
        (f"external IP {ctx['outside_v4']}:53", ctx["outside_v4"], 53),
        (f"external IP {ctx['outside_v4_b']}:443", ctx["outside_v4_b"], 443),
        (f"host redis {ctx['host_ip']}:{ctx['redis_port']}", ctx["host_ip"], ctx["redis_port"]),
        (f"bridge gateway 172.17.0.1:{ctx['redis_port']}", "172.17.0.1", ctx["redis_port"]),
        ("bridge gateway 172.17.0.1:2375 (docker)", "172.17.0.1", 2375),
        *[(f"gateway {gw}:{ctx['redis_port']}", gw, ctx["redis_port"]) for gw in ctx["gateways"]],
        ("127.0.0.1:6379 (loopback redis port)", "127.0.0.1", 6379),
        (f"metadata (link-local) {ctx['metadata']}:80", ctx["metadata"], 80),
    ]
    return [
        Case("fork bomb", FORK_BOMB, check_fork_bomb),
        Case("memory bomb", MEMORY_BOMB, check_memory_bomb, sandbox={"memory_limit": "256M"}),
        Case("fill /workspace, /tmp, /var/tmp", FILL_DISKS, check_fill, sandbox={"disk_limit": "64M"}),
        Case("write to the root filesystem", WRITE_ROOT, check_root_writes),
        Case("zombie factory", ZOMBIES, check_zombies),
        Case("open files until EMFILE", EMFILE, check_emfile),
        Case(
            "network: DNS, external IP, host redis, gateways, metadata",
            network_source(targets),
            network_check(targets),
        ),
        Case("/proc/self/status: capabilities, no_new_privs, seccomp", PROC_STATUS, check_proc_status),
        Case("su/sudo, unshare, mount, ptrace, keyctl, bpf, io_uring, modules", PRIVILEGED, check_privileged),
        Case(
            "writes to sysrq, core_pattern, cgroup files, release_agent", KERNEL_WRITES, check_kernel_writes
        ),
        Case("docker socket, host paths, worker secret", secrets_source(ctx["host_paths"]), check_secrets),
    ]


CASE_NAMES = [
    c.name
    for c in cases(
        {"host_ip": "", "redis_port": 0, "gateways": [], "host_paths": [], "outside_v4": "", "outside_v4_b": "",
         "metadata": ""}
    )
]  # fmt: skip


def host_ip() -> str:
    out = subprocess.run(["ip", "-4", "-o", "addr"], capture_output=True, text=True).stdout
    for line in out.splitlines():
        parts = line.split()
        if parts[1] != "lo" and "inet" in parts:
            return parts[parts.index("inet") + 1].split("/")[0]
    return "127.0.0.1"


def bridge_gateways() -> list[str]:
    out = subprocess.run(
        ["docker", "network", "inspect", "bridge", "--format", "{{range .IPAM.Config}}{{.Gateway}} {{end}}"],
        capture_output=True,
        text=True,
    ).stdout.split()
    found = {g for g in out if g}
    for line in subprocess.run(
        ["ip", "-4", "-o", "addr"], capture_output=True, text=True
    ).stdout.splitlines():
        parts = line.split()
        if parts[1].startswith(("docker", "br-")):
            found.add(parts[parts.index("inet") + 1].split("/")[0])
    return sorted(found)


@pytest.fixture(scope="module")
def listener(tmp_path_factory: pytest.TempPathFactory) -> Iterator[int]:
    """Our own redis-server on 0.0.0.0 (password-protected) for the duration: a real listener on the host."""
    port = free_port()
    folder = tmp_path_factory.mktemp("listener")
    proc = subprocess.Popen(
        [
            "redis-server",
            "--bind",
            "0.0.0.0",
            "--port",
            str(port),
            "--requirepass",
            "sec-test",
            "--save",
            "",
            "--appendonly",
            "no",
            "--dir",
            str(folder),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 10
        while True:
            try:
                socket.create_connection((host_ip(), port), timeout=1).close()
                break
            except OSError:
                if time.monotonic() > deadline:
                    pytest.fail("own redis listener did not come up")
                time.sleep(0.05)
        yield port
    finally:
        proc.terminate()
        proc.wait(timeout=10)


@pytest.fixture(scope="module")
def context(listener: int, owned_targets: Any) -> dict[str, Any]:
    return {
        "owned": owned_targets,
        "outside_v4": owned_targets.public_v4,
        "outside_v4_b": owned_targets.public_v4_b,
        "metadata": owned_targets.link_local,
        "host_ip": host_ip(),
        "redis_port": listener,
        "gateways": bridge_gateways(),
        "host_paths": [
            str(REPO),
            "/var/lib/docker",
            "/etc/docker",
            tempfile.gettempdir() + "/pytest-of-root",
        ],
    }


@pytest.mark.parametrize("case_name", CASE_NAMES)
def test_hostile_program_is_contained(
    case_name: str,
    runtime: str,
    run: Callable[..., Any],
    context: dict[str, Any],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", SECRET)  # the worker's secret, in the process that starts sandboxes
    case = next(c for c in cases(context) if c.name == case_name)
    context = {**context, "free_before": host_free_bytes(), "owned_mark": context["owned"].mark()}
    result = run(case.source, runtime, sandbox=case.sandbox, **case.settings)
    try:
        blocked, detail = case.check(result, runtime, context)
    except Exception as e:  # no RESULT, or not the report the case expects: not blocked as it names
        record(case.name, runtime, False, f"{type(e).__name__}: {e}"[:2000])
        raise
    if case_name == "fork bomb":  # the next job on the host runs normally
        after = run("print('RESULT: fine')", runtime)
        blocked = blocked and after.ok and after.result == "fine"
        detail = f"{detail}; next job: {after.failure() or 'ok'}"
    record(case.name, runtime, blocked, detail)
    assert blocked, detail


def test_ten_gigabytes_of_stdout_are_truncated_and_memory_stays_bounded(
    runtime: str, run: Callable[..., Any]
) -> None:
    source = program(
        """
        import sys
        chunk = "x" * (1 << 20)
        for _ in range(10 * 1024):  # 10 GiB, if the deadline allows
            sys.stdout.write(chunk)
        print("RESULT: wrote everything")
        """
    )
    before = vm_hwm_kib()
    began = time.monotonic()
    result = run(source, runtime, exec_timeout=10)
    elapsed = time.monotonic() - began
    after = vm_hwm_kib()
    cap = 1024**2
    size = len(json.dumps(result.to_dict()))
    growth_mib = (after - before) / 1024
    blocked, detail = verdict(
        {
            "timed_out": result.timed_out,
            "stdout_kept_bytes": len(result.stdout.encode()),
            "record_bytes": size,
            "peak_rss_before_mib": round(before / 1024, 1),
            "peak_rss_after_mib": round(after / 1024, 1),
            "elapsed_s": round(elapsed, 1),
        },
        truncated=result.stdout_truncated and "output" in result.limits_hit,
        kept_within_the_cap=len(result.stdout.encode()) <= cap,
        record_below_3_mib=size < 3 * cap,
        test_process_grew_below_200_mib=growth_mib < 200,
    )
    record("10 GiB of stdout", runtime, blocked, detail)
    assert blocked, detail


TIMEOUT_PROGRAMS = {
    "busy loop": "while True:\n    pass\n",
    "time.sleep": "import time\ntime.sleep(3600)\n",
    "sleep (coreutils)": "import subprocess\nsubprocess.run(['sleep', '3600'])\n",
}
RUNS_PER_RUNTIME = 10
EXEC_TIMEOUT_S = 1.5


def test_programs_past_their_deadline_are_killed_within_a_second(
    runtime: str, run: Callable[..., Any]
) -> None:
    overshoots: list[float] = []
    kinds = list(TIMEOUT_PROGRAMS)
    for i in range(RUNS_PER_RUNTIME):
        result = run(TIMEOUT_PROGRAMS[kinds[i % len(kinds)]], runtime, exec_timeout=EXEC_TIMEOUT_S)
        assert result.timed_out and result.exit_code == -1, (result.exit_code, result.stderr)
        t = result.timings
        exec_wall = t["total_s"] - t["acquire_s"] - t["files_s"]  # from the host's side
        overshoots.append(exec_wall - EXEC_TIMEOUT_S)
    blocked, detail = verdict(
        {
            "runs": len(overshoots),
            "exec_timeout_s": EXEC_TIMEOUT_S,
            "overshoot_p50_s": round(percentile(overshoots, 50), 3),
            "overshoot_p95_s": round(percentile(overshoots, 95), 3),
            "overshoot_max_s": round(max(overshoots), 3),
        },
        every_run_killed_within_1_s=max(overshoots) < 1.0,
    )
    record("killed at exec_timeout", runtime, blocked, detail)
    assert blocked, overshoots


def test_job_b_sees_nothing_of_job_a(runtime: str, run: Callable[..., Any]) -> None:
    marker = f"sf-marker-{time.monotonic_ns()}"
    job_a = program(
        f"""
        import subprocess
        for path in ("/workspace/{marker}.txt", "/tmp/{marker}.txt", "/var/tmp/{marker}.txt"):
            with open(path, "w") as f:
                f.write("secret of job A")
        subprocess.Popen(["python3", "-c", "import time; time.sleep(600)", "{marker}"], start_new_session=True)
        print("RESULT: planted")
        """
    )
    job_b = program(
        f"""
        import json, os
        seen = {{"files": [], "processes": []}}
        for folder in ("/workspace", "/tmp", "/var/tmp"):
            for base, _dirs, names in os.walk(folder):
                seen["files"] += [os.path.join(base, n) for n in names if "{marker}" in n]
        for pid in os.listdir("/proc"):
            if pid.isdigit():
                try:
                    with open(f"/proc/{{pid}}/cmdline", "rb") as f:
                        if b"{marker}" in f.read():
                            seen["processes"].append(int(pid))
                except OSError:
                    pass
        print("RESULT: " + json.dumps(seen))
        """
    )
    first = run(job_a, runtime)
    assert first.ok and first.result == "planted", first.failure()
    second = run(job_b, runtime)
    assert second.ok, second.failure()
    blocked, detail = verdict(
        second.result,
        another_container=first.container_id != second.container_id,
        nothing_of_job_a_seen=second.result == {"files": [], "processes": []},
    )
    record("job B sees job A's files or processes", runtime, blocked, detail)
    assert blocked, detail


# ---- fixed gaps (were strict xfails): each now holds under both runtimes ----------------------------
ORPHANS = program(
    """
    import os, time
    middle = os.fork()
    if middle == 0:
        for _ in range(50):
            if os.fork() == 0:
                time.sleep(0.2)
                os._exit(0)
        os._exit(0)
    os.waitpid(middle, 0)
    time.sleep(1.0)
    print("RESULT: ok")
    """
)


def test_orphans_that_exit_do_not_take_a_gvisor_sandbox_down(run: Callable[..., Any]) -> None:
    """Was: 50 tasks needed more host threads than the pids cgroup allowed under runsc; the limit is now
    RLIMIT_NPROC inside gVisor with a larger host backstop (sandfleet/worker/sandbox/docker/spec.py)."""
    result = run(ORPHANS, "runsc")
    assert result.ok and result.result == "ok", result.failure()


def test_a_memory_bomb_under_gvisor_is_reported_as_out_of_memory(run: Callable[..., Any]) -> None:
    result = run(MEMORY_BOMB, "runsc", sandbox={"memory_limit": "256M"})
    assert result.oom_killed and "out of memory" in (result.failure() or "")


@pytest.mark.parametrize("runtime", ["runc", "runsc"])
@pytest.mark.parametrize("target", ["ptrace sibling", "ptrace init (pid 1)"])
def test_ptrace_inside_the_sandbox_is_refused(run: Callable[..., Any], runtime: str, target: str) -> None:
    """The agent's own seccomp filter (stacked on Docker's) refuses ptrace."""
    result = run(PRIVILEGED, runtime)
    assert not payload(result)[target]["ok"]


@pytest.mark.parametrize("runtime", ["runc", "runsc"])
def test_io_uring_is_refused(run: Callable[..., Any], runtime: str) -> None:
    result = run(PRIVILEGED, runtime)
    assert not payload(result)["io_uring_setup"]["ok"]


# ---- a program that kills every process it sees ----------------------------------------------------
KILL_EVERY_PROCESS = program(
    """
    import json, os, signal
    me = os.getpid()
    signalled = []
    for pid in sorted(int(p) for p in os.listdir("/proc") if p.isdigit()):
        if pid != me:
            try:
                os.kill(pid, signal.SIGKILL)
                signalled.append(pid)
            except OSError:
                pass
    print("RESULT: " + json.dumps({"signalled": signalled, "init_alive": os.path.exists("/proc/1")}), flush=True)
    os.kill(me, signal.SIGKILL)  # and itself, last
    """
)


def test_a_program_that_kills_every_process_it_sees_is_reported_as_what_it_did(
    runtime: str, run: Callable[..., Any]
) -> None:
    """No memory limit is hit, and the result never says so. Under runc the agent is pid 1 and the
    kernel drops the program's SIGKILL to it: the agent lives, and the program ends by its own kill.
    gVisor delivers the signal: the agent dies, the sandbox with it, and the host reports that the
    program killed the sandbox's agent (the engine saw neither an OOM kill nor a kill request)."""
    result = run(KILL_EVERY_PROCESS, runtime)
    failure = result.failure() or ""
    assert not result.oom_killed and result.limits_hit == [] and "memory" not in failure, (
        result.limits_hit,
        failure,
    )
    if runtime == "runc":
        report = payload(result)
        blocked, detail = verdict(
            {"signalled": report["signalled"], "exit_code": result.exit_code, "failure": failure},
            the_agent_was_signalled=1 in report["signalled"],
            the_agent_lived_on=report["init_alive"] and not result.agent_killed and result.error is None,
            ended_by_its_own_kill=result.exit_code == 137 and failure == "the program exited with code 137",
        )
        record("kill every process it sees (the agent too)", runtime, blocked, detail)
        assert blocked, detail
        return
    assert result.agent_killed and result.exit_code == -1 and not result.result_found, result.to_dict()
    assert result.error == AGENT_KILLED and failure == AGENT_KILLED
    record(
        "kill every process it sees (the agent too)",
        runtime,
        False,
        {"agent_killed": True, "failure": failure, "contained": "only its own sandbox ended"},
    )


def test_an_attack_that_breaks_is_not_counted_as_refused(run: Callable[..., Any]) -> None:
    """An attempt that fails for another reason than the mechanism its row names (here a NameError in
    the attack, and an errno other than the expected one) makes the row not blocked."""
    source = PRELUDE + program(
        """
        attempt("write /etc/passwd", lambda: open(undefined_name, "a"))
        attempt("create /evil", lambda: open("/evil", "w"))
        done()
        """
    )
    report = payload(run(source, "runc"))
    assert report["write /etc/passwd"]["exception"].startswith("NameError"), report
    blocked, detail = refused_as(
        report, {"write /etc/passwd": refused("EACCES"), "create /evil": refused("EACCES")}, "runc"
    )
    assert not blocked
    assert set(detail["not as expected"]) == {"write /etc/passwd", "create /evil"}, (
        detail
    )  # EROFS, not EACCES
    assert refused_as(report, {"create /evil": refused("EROFS")}, "runc")[0] is False  # one not expected
    assert refused_as({"create /evil": report["create /evil"]}, {"create /evil": refused("EROFS")}, "runc")[0]
