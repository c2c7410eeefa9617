"""Run inside a sandbox (``python3 -c <this file's text>``): prints, as JSON, what isolation it sees.

Identity, capabilities, no-new-privileges, the seccomp mode and syscalls it must refuse, which places
are writable, the cgroup limits (v1 or v2), the network interfaces and the mounts. Two OCI runtimes
given the same container options must print the same view (benchmarks/oci_runtimes.py); that it
sees a locked-down sandbox, and a weaker one as weaker, is tests/sandbox/test_isolation_probe.py.
Standard library only, no Sandfleet imports: the host sends this file's text (docker/probe.py).
"""

import ctypes
import errno
import json
import os
import socket

STATUS_KEYS = ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb", "NoNewPrivs", "Seccomp")
CGROUP_FILES = {  # what: (cgroup v2 file, cgroup v1 file)
    "pids": ("/sys/fs/cgroup/pids.max", "/sys/fs/cgroup/pids/pids.max"),
    "memory": ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"),
    "memory_swap": ("/sys/fs/cgroup/memory.swap.max", "/sys/fs/cgroup/memory/memory.memsw.limit_in_bytes"),
    "cpu": ("/sys/fs/cgroup/cpu.max", "/sys/fs/cgroup/cpu/cpu.cfs_quota_us"),
}
CLONE_NEWUSER, CLONE_NEWNS = 0x10000000, 0x00020000
SYS_KEYCTL = {"x86_64": 250, "aarch64": 219}
MOUNT_FLAGS_SHOWN = ("ro", "rw", "nosuid", "nodev", "noexec")


def status():
    with open("/proc/self/status") as f:
        pairs = (line.split(":", 1) for line in f if ":" in line)
        return {key: value.strip() for key, value in pairs if key in STATUS_KEYS}


def first_readable(paths):
    for path in paths:
        try:
            with open(path) as f:
                return f.read().strip()
        except OSError:
            continue
    return None


def writable(path):
    try:
        with open(path, "w"):
            pass
        os.unlink(path)
        return "written"
    except OSError as e:
        return errno.errorcode.get(e.errno or 0, str(e.errno))


def refused(call):
    libc = ctypes.CDLL(None, use_errno=True)
    ctypes.set_errno(0)
    if call(libc) == 0:
        return "allowed"
    return errno.errorcode.get(ctypes.get_errno(), "?")


def mounts():
    found = []
    with open("/proc/self/mounts") as f:
        for line in f:
            _source, target, kind, options = line.split()[:4]
            shown = sorted(o for o in options.split(",") if o in MOUNT_FLAGS_SHOWN)
            found.append([target, kind, shown])
    return sorted(found)


keyctl = SYS_KEYCTL.get(os.uname().machine)
print(
    json.dumps(
        {
            "ids": [os.getuid(), os.getgid(), sorted(os.getgroups())],
            "status": status(),
            "syscalls": {
                "unshare(user)": refused(lambda libc: libc.unshare(CLONE_NEWUSER)),
                "unshare(mount)": refused(lambda libc: libc.unshare(CLONE_NEWNS)),
                "mount": refused(lambda libc: libc.mount(b"none", b"/tmp", b"tmpfs", 0, None)),
                "keyctl": refused(lambda libc: libc.syscall(keyctl, 1, None)) if keyctl else None,
            },
            "writable": {
                path: writable(path) for path in ("/probe", "/etc/probe", "/tmp/probe", "/workspace/probe")
            },
            "cgroup": {what: first_readable(paths) for what, paths in CGROUP_FILES.items()},
            "interfaces": sorted(os.listdir("/sys/class/net")),
            "hostname": socket.gethostname(),
            "mounts": mounts(),
        },
        sort_keys=True,
    )
)
