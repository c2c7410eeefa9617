"""The agent's own seccomp filter, stacked on the engine's profile: the syscalls it refuses, by name.

Docker 20.10's default profile still allows io_uring and ptrace, among others. The agent installs
this filter before any command runs; filters stack in the kernel (and in gVisor's), so a syscall
must pass both. Refused calls fail with EPERM; clone3 says ENOSYS so libc falls back to clone,
whose namespace flags are refused. A process of another architecture's ABI (x32 on x86_64, or an
arch other than the one the filter was built for) is refused everything.

Shipped into every sandbox with the agent (spec.boot_payload) as ``sandfleet_syscall_filter``;
like the agent it is standard-library only and imports nothing at load time (ctypes only when the
filter is installed). The tables are by name so that a reviewer can read what is refused; the
numbers of each name per architecture are checked against the kernel's headers by
tests/sandbox/test_syscall_filter.py.
"""

# Refused with EPERM, by name, in groups.
DENIED = (
    *("io_uring_setup", "io_uring_enter", "io_uring_register"),  # a second syscall path, past seccomp
    *("ptrace", "process_vm_readv", "process_vm_writev"),  # reading or steering other processes
    *("add_key", "request_key", "keyctl"),  # kernel keyrings
    *("bpf", "perf_event_open", "userfaultfd"),  # kernel attack surface
    *("unshare", "setns"),  # new or other namespaces
    *("mount", "umount2", "pivot_root", "chroot"),
    *("init_module", "finit_module", "delete_module", "kexec_load", "kexec_file_load"),
    *("name_to_handle_at", "open_by_handle_at", "reboot", "swapon", "swapoff", "acct"),
)
# Checked apart: clone's flags (no namespace flags), and clone3, whose flags sit in memory a filter
# cannot read (ENOSYS, so libc uses clone).
FLAGS_CHECKED = "clone"
NOT_IMPLEMENTED = "clone3"

# The numbers of those names: x86_64 from arch/x86/entry/syscalls/syscall_64.tbl, aarch64 from
# include/uapi/asm-generic/unistd.h.
SYSCALL_NUMBERS = {
    "x86_64": {
        "io_uring_setup": 425,
        "io_uring_enter": 426,
        "io_uring_register": 427,
        "ptrace": 101,
        "process_vm_readv": 310,
        "process_vm_writev": 311,
        "add_key": 248,
        "request_key": 249,
        "keyctl": 250,
        "bpf": 321,
        "perf_event_open": 298,
        "userfaultfd": 323,
        "unshare": 272,
        "setns": 308,
        "mount": 165,
        "umount2": 166,
        "pivot_root": 155,
        "chroot": 161,
        "init_module": 175,
        "finit_module": 313,
        "delete_module": 176,
        "kexec_load": 246,
        "kexec_file_load": 320,
        "name_to_handle_at": 303,
        "open_by_handle_at": 304,
        "reboot": 169,
        "swapon": 167,
        "swapoff": 168,
        "acct": 163,
        "clone": 56,
        "clone3": 435,
    },
    "aarch64": {
        "io_uring_setup": 425,
        "io_uring_enter": 426,
        "io_uring_register": 427,
        "ptrace": 117,
        "process_vm_readv": 270,
        "process_vm_writev": 271,
        "add_key": 217,
        "request_key": 218,
        "keyctl": 219,
        "bpf": 280,
        "perf_event_open": 241,
        "userfaultfd": 282,
        "unshare": 97,
        "setns": 268,
        "mount": 40,
        "umount2": 39,
        "pivot_root": 41,
        "chroot": 51,
        "init_module": 105,
        "finit_module": 273,
        "delete_module": 106,
        "kexec_load": 104,
        "kexec_file_load": 294,
        "name_to_handle_at": 264,
        "open_by_handle_at": 265,
        "reboot": 142,
        "swapon": 224,
        "swapoff": 225,
        "acct": 89,
        "clone": 220,
        "clone3": 435,
    },
}
AUDIT_ARCH = {"x86_64": 0xC000003E, "aarch64": 0xC00000B7}  # seccomp_data.arch of each ABI
NAMESPACE_FLAGS = 0x7E020000  # CLONE_NEWNS|NEWCGROUP|NEWUTS|NEWIPC|NEWUSER|NEWPID|NEWNET
X32_SYSCALL_BIT = 0x40000000  # x86_64's x32 ABI: the same calls under other numbers

# Classic BPF: instruction codes, seccomp return values, and offsets into struct seccomp_data.
LD_W_ABS, JEQ_K, JGE_K, JSET_K, RET_K = 0x20, 0x15, 0x35, 0x45, 0x06
RET_ALLOW, RET_EPERM, RET_ENOSYS = 0x7FFF0000, 0x00050000 | 1, 0x00050000 | 38
NR_OFFSET, ARCH_OFFSET, ARG0_OFFSET = 0, 4, 16


def program(machine: str) -> "list[tuple[int, int, int, int]]":
    """The filter for ``machine`` (``os.uname().machine``), as (code, jt, jf, k) instructions.

    Every jump goes forward (BPF allows no other): checks, then the clone-flags block, then returns.
    Raises KeyError for an architecture without a table.
    """
    numbers = SYSCALL_NUMBERS[machine]
    body: list[tuple[int, int | str, int, int]] = [(LD_W_ABS, 0, 0, NR_OFFSET)]
    if machine == "x86_64":
        body.append((JGE_K, "EPERM", 0, X32_SYSCALL_BIT))
    body += [(JEQ_K, "EPERM", 0, numbers[name]) for name in DENIED]
    body += [
        (JEQ_K, "CLONE", 0, numbers[FLAGS_CHECKED]),
        (JEQ_K, "ENOSYS", 0, numbers[NOT_IMPLEMENTED]),
        (RET_K, 0, 0, RET_ALLOW),
    ]
    labels = {"CLONE": len(body)}
    body += [(LD_W_ABS, 0, 0, ARG0_OFFSET), (JSET_K, "EPERM", 0, NAMESPACE_FLAGS), (RET_K, 0, 0, RET_ALLOW)]
    labels.update(EPERM=len(body), ENOSYS=len(body) + 1)
    body += [(RET_K, 0, 0, RET_EPERM), (RET_K, 0, 0, RET_ENOSYS)]
    # Another architecture's ABI: refuse everything.
    prog = [(LD_W_ABS, 0, 0, ARCH_OFFSET), (JEQ_K, 1, 0, AUDIT_ARCH[machine]), (RET_K, 0, 0, RET_EPERM)]
    for i, (code, jt, jf, k) in enumerate(body):
        prog.append((code, labels[jt] - i - 1 if isinstance(jt, str) else jt, jf, k))
    return prog


def install(machine: str) -> bool:
    """Install the filter for this process and all it starts. True when in place."""
    import ctypes

    if machine not in SYSCALL_NUMBERS:
        return False
    prog = program(machine)

    class SockFilter(ctypes.Structure):
        _fields_ = [
            ("code", ctypes.c_ushort),
            ("jt", ctypes.c_ubyte),
            ("jf", ctypes.c_ubyte),
            ("k", ctypes.c_uint),
        ]

    class SockFprog(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.POINTER(SockFilter))]

    array = (SockFilter * len(prog))(*[SockFilter(*ins) for ins in prog])
    fprog = SockFprog(len(prog), array)
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(38, 1, 0, 0, 0)  # PR_SET_NO_NEW_PRIVS (Docker set it already; needed without root)
    return bool(libc.prctl(22, 2, ctypes.byref(fprog), 0, 0) == 0)  # PR_SET_SECCOMP, SECCOMP_MODE_FILTER
