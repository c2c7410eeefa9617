"""Hostile programs: each case runs a real attack inside a real sandbox, under runc and under runsc.

One table of cases. Each program tries its attack, prints what happened as ``RESULT: {json}``, and its
check asserts the outcome (blocked, contained, or recorded as it is under gVisor). Every run ends with
the leftover check of conftest.py: the container is gone and no host process serves it any more.
Outcomes go to ``artifacts/security-results.json`` (see SECURITY.md).

The network cases use network "none": nothing can leave the machine, which is the point.
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

from .helpers import REPO, free_port, percentile, program, record, vm_hwm_kib

pytestmark = [pytest.mark.docker]

SECRET = "sk-sandfleet-fake-worker-secret-4242"
ERRNO_BLOCKED = {"EPERM", "EACCES", "ENOSYS", "EROFS"}

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
        except Exception as e:
            report[name] = {"ok": False, "errno": None, "error": f"{type(e).__name__}: {e}"}


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


def all_refused(report: dict[str, Any], allowed_errnos: set[str] = ERRNO_BLOCKED) -> dict[str, Any]:
    """Assert every attempt in the report failed with one of ``allowed_errnos``; return a summary."""
    for name, outcome in report.items():
        assert not outcome["ok"], f"{name} succeeded: {outcome}"
        assert outcome["errno"] in allowed_errnos or outcome["errno"] is None, f"{name}: {outcome}"
    return {name: outcome.get("errno") or outcome.get("error") for name, outcome in report.items()}


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
    # runc: the pids cgroup refuses; gVisor: its kernel's RLIMIT_NPROC does (worker/sandbox/spec.py).
    outcome = payload(run)["fork_bomb"]
    assert outcome["errno"] == "EAGAIN", outcome
    assert outcome["forked"] < 256, outcome  # pids_limit 256 (the agent, init and the program count too)
    return True, f"fork stopped with EAGAIN after {outcome['forked']} children (pids_limit 256)"


MEMORY_BOMB = program(
    """
    chunks = []
    while True:
        chunks.append(b"\\x01" * (16 << 20))
    """
)


def check_memory_bomb(run: Any, runtime: str, ctx: dict[str, Any]) -> tuple[bool, Any]:
    # runc: the program is OOM-killed; gVisor: the whole sandbox is, and the host reads Docker's OOMKilled.
    assert run.exit_code == 137, (run.exit_code, run.stderr[-500:])
    failure = run.failure() or ""
    assert run.oom_killed and "memory" in run.limits_hit, run.limits_hit
    assert failure == "the program ran out of memory (exit code 137)"
    return True, {"exit_code": run.exit_code, "oom_killed": run.oom_killed, "failure": failure}


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
    for where, limit in (("workspace", 64), ("tmp", 64), ("var_tmp", 64)):
        outcome = report[where]
        assert not outcome["ok"] and outcome["errno"] == "ENOSPC", (where, outcome)
        assert outcome["mib"] <= limit, (where, outcome)
    written = sum(o["mib"] for o in report.values()) << 20
    drop = ctx["free_before"] - host_free_bytes()
    # Other people share this disk: allow noise, but the sandbox's writes must not have landed on it.
    assert drop < written, f"host free space dropped by {drop} bytes while the sandbox wrote {written}"
    return True, {
        "enospc_after_mib": {k: v["mib"] for k, v in report.items()},
        "host_free_drop_mib": round(drop / 2**20, 1),
    }


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


def check_refused(run: Any, runtime: str, ctx: dict[str, Any]) -> tuple[bool, Any]:
    return True, all_refused(payload(run))


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
    assert run.exit_code == 0 and not run.timed_out
    assert report["own_zombies"] == 50, report
    assert report["orphan_zombies_left"] == [], report
    return True, {"own_zombies_seen": report["own_zombies"], "orphans_left_unreaped": 0}


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
    assert outcome["errno"] == "EMFILE" and outcome["opened"] < 1024, outcome
    return True, f"EMFILE after {outcome['opened']} files (nofile 1024)"


def network_source(targets: list[tuple[str, str, int]]) -> str:
    return PRELUDE + program(
        f"""
        def connect(host, port):
            with socket.create_connection((host, port), timeout=3):
                return "connected"

        attempt("dns pypi.org", lambda: socket.getaddrinfo("pypi.org", 443))
        attempt("dns localhost-free name", lambda: socket.gethostbyname("example.com"))
        for label, host, port in {targets!r}:
            attempt(label, lambda h=host, p=port: connect(h, p))
        report["interfaces"] = {{"ok": False, "errno": None, "error": str(socket.if_nameindex())}}
        done()
        """
    )


def check_network(run: Any, runtime: str, ctx: dict[str, Any]) -> tuple[bool, Any]:
    report = payload(run)
    interfaces = report.pop("interfaces")["error"]
    assert "eth" not in interfaces, interfaces
    loopback = {k: report.pop(k) for k in list(report) if k.startswith("127.0.0.1")}
    for name, outcome in loopback.items():  # the sandbox's own loopback: nothing listens there
        assert not outcome["ok"] and outcome["errno"] == "ECONNREFUSED", (name, outcome)
    summary = all_refused(report, ERRNO_BLOCKED | {"EAI", "ENETUNREACH", "EHOSTUNREACH"})
    summary.update({k: v["errno"] for k, v in loopback.items()})
    return True, {**summary, "interfaces": interfaces}


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
    assert int(fields["CapEff"][0], 16) == 0 and int(fields["CapPrm"][0], 16) == 0, fields
    assert fields["Uid"][0] == "10001", fields
    if runtime == "runc":
        assert fields["NoNewPrivs"] == ["1"] and fields["Seccomp"] == ["2"], fields
    # runsc: gVisor's own /proc; it is recorded as shown (its kernel is the boundary, not seccomp).
    return True, {k: v[0] for k, v in fields.items() if v}


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


def check_privileged(run: Any, runtime: str, ctx: dict[str, Any]) -> tuple[bool, Any]:
    report = payload(run)
    # ptrace, io_uring, namespaces and mounts are refused under both runtimes: Docker's profile and the
    # agent's own seccomp filter stacked on it (worker/sandbox/agent.py).
    return True, all_refused(report)


KERNEL_WRITES = PRELUDE + program(
    """
    import glob

    def write(path, text):
        with open(path, "w") as f:
            f.write(text)
        return "written"

    attempt("/proc/sysrq-trigger", lambda: write("/proc/sysrq-trigger", "h"))
    attempt("/proc/sys/kernel/core_pattern", lambda: write("/proc/sys/kernel/core_pattern", "|/tmp/x"))
    attempt("/proc/sys/vm/drop_caches", lambda: write("/proc/sys/vm/drop_caches", "3"))
    targets = sorted(glob.glob("/sys/fs/cgroup/*/release_agent") + glob.glob("/sys/fs/cgroup/release_agent"))
    for path in targets or ["/sys/fs/cgroup/memory/release_agent"]:
        attempt(path, lambda p=path: write(p, "/tmp/x"))
    for path in ("/sys/fs/cgroup/memory/memory.limit_in_bytes", "/sys/fs/cgroup/pids/pids.max",
                 "/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/pids.max",
                 "/sys/fs/cgroup/memory/cgroup.procs", "/sys/fs/cgroup/cgroup.procs",
                 "/sys/fs/cgroup/memory/notify_on_release"):
        if os.path.exists(path):
            attempt(path, lambda p=path: write(p, "max" if "max" in p else "1"))
    attempt("mount cgroup", lambda: syscall(165, b"cgroup", b"/workspace", b"cgroup", 0, b"memory"))
    done()
    """
)


def check_kernel_writes(run: Any, runtime: str, ctx: dict[str, Any]) -> tuple[bool, Any]:
    report = payload(run)
    # ENOENT: the file does not exist inside (gVisor shows fewer of them); nothing was written either way.
    return True, all_refused(report, ERRNO_BLOCKED | {"ENOENT", "EINVAL"})


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
    return True, all_refused(payload(run), ERRNO_BLOCKED | {"ENOENT"})


def cases(ctx: dict[str, Any]) -> list[Case]:
    targets = [
        ("1.1.1.1:53 (external IP)", "1.1.1.1", 53),
        ("1.1.1.1:443 (external IP)", "1.1.1.1", 443),
        (f"host redis {ctx['host_ip']}:{ctx['redis_port']}", ctx["host_ip"], ctx["redis_port"]),
        (f"bridge gateway 172.17.0.1:{ctx['redis_port']}", "172.17.0.1", ctx["redis_port"]),
        ("bridge gateway 172.17.0.1:2375 (docker)", "172.17.0.1", 2375),
        *[(f"gateway {gw}:{ctx['redis_port']}", gw, ctx["redis_port"]) for gw in ctx["gateways"]],
        ("127.0.0.1:6379 (loopback redis port)", "127.0.0.1", 6379),
        ("169.254.169.254:80 (metadata)", "169.254.169.254", 80),
    ]
    return [
        Case("fork bomb", FORK_BOMB, check_fork_bomb),
        Case("memory bomb", MEMORY_BOMB, check_memory_bomb, sandbox={"memory_limit": "256M"}),
        Case("fill /workspace, /tmp, /var/tmp", FILL_DISKS, check_fill, sandbox={"disk_limit": "64M"}),
        Case("write to the root filesystem", WRITE_ROOT, check_refused),
        Case("zombie factory", ZOMBIES, check_zombies),
        Case("open files until EMFILE", EMFILE, check_emfile),
        Case(
            "network: DNS, external IP, host redis, gateways, metadata",
            network_source(targets),
            check_network,
        ),
        Case("/proc/self/status: capabilities, no_new_privs, seccomp", PROC_STATUS, check_proc_status),
        Case("su/sudo, unshare, mount, ptrace, keyctl, bpf, io_uring, modules", PRIVILEGED, check_privileged),
        Case(
            "writes to sysrq, core_pattern, cgroup files, release_agent", KERNEL_WRITES, check_kernel_writes
        ),
        Case("docker socket, host paths, worker secret", secrets_source(ctx["host_paths"]), check_secrets),
    ]


CASE_NAMES = [c.name for c in cases({"host_ip": "", "redis_port": 0, "gateways": [], "host_paths": []})]


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
def context(listener: int) -> dict[str, Any]:
    return {
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
    context = {**context, "free_before": host_free_bytes()}
    result = run(case.source, runtime, sandbox=case.sandbox, **case.settings)
    try:
        blocked, detail = case.check(result, runtime, context)
    except AssertionError as e:
        record(case.name, runtime, False, str(e)[:2000])
        raise
    record(case.name, runtime, blocked, detail)
    if case_name == "fork bomb":  # the next job on the host runs normally
        after = run("print('RESULT: fine')", runtime)
        assert after.ok and after.result == "fine", after.failure()


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
    assert result.stdout_truncated and "output" in result.limits_hit
    assert len(result.stdout.encode()) <= cap
    assert size < 3 * cap, f"the run's record is {size} bytes"
    growth_mib = (after - before) / 1024
    assert growth_mib < 200, f"peak RSS of the test process grew by {growth_mib:.0f} MiB"
    record(
        "10 GiB of stdout",
        runtime,
        True,
        {
            "timed_out": result.timed_out,
            "stdout_kept_bytes": len(result.stdout.encode()),
            "record_bytes": size,
            "peak_rss_before_mib": round(before / 1024, 1),
            "peak_rss_after_mib": round(after / 1024, 1),
            "elapsed_s": round(elapsed, 1),
        },
    )


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
    p95 = percentile(overshoots, 95)
    assert max(overshoots) < 1.0, overshoots
    record(
        "killed at exec_timeout",
        runtime,
        True,
        {
            "runs": len(overshoots),
            "exec_timeout_s": EXEC_TIMEOUT_S,
            "overshoot_p50_s": round(percentile(overshoots, 50), 3),
            "overshoot_p95_s": round(p95, 3),
            "overshoot_max_s": round(max(overshoots), 3),
        },
    )


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
    assert first.container_id != second.container_id
    assert second.result == {"files": [], "processes": []}, second.result
    record("job B sees job A's files or processes", runtime, True, second.result)


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
    RLIMIT_NPROC inside gVisor with a larger host backstop (worker/sandbox/spec.py)."""
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
