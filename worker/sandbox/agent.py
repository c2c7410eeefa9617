"""The in-container agent: the sandbox's main process, spoken to over the container's stdin/stdout.

This file is sent into every container at start (it is not baked into the image) and runs there
under python3 with the standard library only. It waits for frames from the host and:
  - runs commands (one at a time) as its own process group, capturing stdout/stderr up to a cap;
    a Python program runs in a fork of the agent's own interpreter (started as ``python3 -s``, as
    programs are) when it would start the same way (``starts_like_me``): ~5 ms of CPU per run
    instead of ~13 ms for a new interpreter, out of ~45 ms a trivial job costs inside its sandbox;
  - for programs, relays tool calls between the program (two pipes) and the host;
  - writes, reads and lists files from inside (Docker's archive API cannot, on read-only roots);
  - kills everything it started when told to, or when its own copy of the deadline passes.

Frames both ways: struct "!cII" (kind, header length, body length), a header, then the body. The
host's headers are marshal data (the host is trusted here); the agent's are JSON, which the host
parses as untrusted input. Everything here is untrusted by the host: the program runs as the same
user and may kill or impersonate the agent; the host enforces every cap and deadline itself.

Start-up is paid once per job, so the agent imports only built-in modules: json (through re and
enum), selectors and signal would cost a sandbox ~12 ms of CPU, about 4% of a trivial job.
"""

import gc
import marshal
import os
import select
import struct
import sys
import time

try:
    import _signal as signal  # built in; the signal module adds enum wrappers this does not need
except ImportError:  # another Python implementation
    import signal

HEAD = struct.Struct("!cII")
PIPE_LEN = struct.Struct("!I")
CHUNK = 65536
# A command has exited but something it started still holds its stdout/stderr open (a daemonised
# child): read what is buffered for this long, then kill the leftovers instead of waiting for them.
EXIT_POLL_S = 0.05
EXIT_GRACE_S = 0.25
# Replies the program has not read, in bytes, past which the agent stops reading its requests.
MAX_PENDING_REPLIES = 1 << 20
# Requests forwarded and not yet answered, past which the agent stops reading more (the stub has one).
MAX_OUTSTANDING_CALLS = 16
# The modules of a fresh interpreter, recorded by the boot loader before it imported anything.
STARTUP_MODULES = globals().get("STARTUP_MODULES", frozenset())


# JSON string escapes: control characters, quote and backslash; lone surrogates (undecodable file
# names) become \udcXX through the "backslashreplace" encoding of the whole header.
_ESCAPES = {i: f"\\u{i:04x}" for i in range(32)}
_ESCAPES.update({ord('"'): '\\"', ord("\\"): "\\\\"})


def to_json(value):
    """JSON text of the agent's headers: dicts, lists, strings, numbers, booleans and None."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(int(value))
    if isinstance(value, float):
        return repr(value) if value == value and value not in (float("inf"), float("-inf")) else "null"
    if isinstance(value, str):
        return '"' + value.translate(_ESCAPES) + '"'
    if isinstance(value, dict):
        return "{" + ",".join(to_json(str(k)) + ":" + to_json(v) for k, v in value.items()) + "}"
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(to_json(v) for v in value) + "]"
    raise TypeError(f"cannot encode {type(value).__name__} as JSON")


def send(kind, header=None, body=b""):
    data = to_json(header or {}).encode("utf-8", "backslashreplace")
    out = HEAD.pack(kind, len(data), len(body)) + data + body
    view = memoryview(out)
    while view:
        view = view[os.write(1, view) :]


def not_dumpable():
    """Keep same-uid programs from ptracing the agent or opening its fds through /proc."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE = 4
        return True
    except Exception:
        return False


def network_view():
    """What this sandbox sees of the network, for the host to check before any program runs:
    its network namespace, its interfaces, and the interfaces its routes go through (v4 and v6)."""
    view = {"netns": None, "interfaces": None, "routes": None}
    try:
        view["netns"] = os.readlink("/proc/self/ns/net")
        view["interfaces"] = sorted(os.listdir("/sys/class/net"))
        routes = set()
        for path, column in (("/proc/net/route", 0), ("/proc/net/ipv6_route", -1)):
            with open(path) as f:
                lines = f.read().splitlines()[1 if column == 0 else 0 :]  # route has a header
            routes.update(line.split()[column] for line in lines if line.strip())
        view["routes"] = sorted(routes)
    except OSError:
        pass  # left None: the host refuses what it cannot check
    return view


# -- a second syscall filter, stacked on the engine's own seccomp profile ---------------------------
# Docker 20.10's default profile still allows io_uring and ptrace, among others. The agent adds a
# seccomp filter of its own before any command runs; filters stack in the kernel (and in gVisor's),
# so a syscall must pass both. Denied calls fail with EPERM; clone3 says ENOSYS so libc falls back
# to clone, whose namespace flags are refused.
_DENIED = {  # arch -> syscall numbers
    0xC000003E: (  # x86_64
        425,
        426,
        427,  # io_uring_setup, io_uring_enter, io_uring_register
        101,
        310,
        311,  # ptrace, process_vm_readv, process_vm_writev
        248,
        249,
        250,  # add_key, request_key, keyctl
        321,
        298,
        323,  # bpf, perf_event_open, userfaultfd
        272,
        308,  # unshare, setns
        165,
        166,
        155,
        161,  # mount, umount2, pivot_root, chroot
        175,
        313,
        176,
        246,
        320,  # init_module, finit_module, delete_module, kexec_load, kexec_file_load
        303,
        304,
        169,
        167,
        168,
        163,  # name/open_by_handle_at, reboot, swapon, swapoff, acct
    ),
    0xC00000B7: (  # aarch64
        425,
        426,
        427,
        117,
        270,
        271,
        217,
        218,
        219,
        280,
        241,
        282,
        97,
        268,
        40,
        39,
        41,
        51,
        105,
        273,
        106,
        104,
        294,
        264,
        265,
        142,
        224,
        225,
        89,
    ),
}
_CLONE = {0xC000003E: 56, 0xC00000B7: 220}
_CLONE3 = 435
_NAMESPACE_FLAGS = 0x7E020000  # CLONE_NEWNS|NEWCGROUP|NEWUTS|NEWIPC|NEWUSER|NEWPID|NEWNET
_X32_BIT = 0x40000000


def install_syscall_filter():
    """Install the extra seccomp filter for this process and all it starts. True when in place."""
    import ctypes

    arch = {"x86_64": 0xC000003E, "aarch64": 0xC00000B7}.get(os.uname().machine)
    if arch is None:
        return False
    ld, jeq, jge, jset, ret = 0x20, 0x15, 0x35, 0x45, 0x06
    allow, eperm, enosys = 0x7FFF0000, 0x00050000 | 1, 0x00050000 | 38
    # Every jump goes forward (BPF allows no other): checks, then the clone-flags block, then returns.
    body = [(ld, 0, 0, 0)]  # the syscall number
    if arch == 0xC000003E:
        body.append((jge, "EPERM", 0, _X32_BIT))
    body += [(jeq, "EPERM", 0, nr) for nr in _DENIED[arch]]
    body += [(jeq, "CLONE", 0, _CLONE[arch]), (jeq, "ENOSYS", 0, _CLONE3), (ret, 0, 0, allow)]
    labels = {"CLONE": len(body)}
    body += [(ld, 0, 0, 16), (jset, "EPERM", 0, _NAMESPACE_FLAGS), (ret, 0, 0, allow)]  # clone: flags
    labels.update(EPERM=len(body), ENOSYS=len(body) + 1)
    body += [(ret, 0, 0, eperm), (ret, 0, 0, enosys)]
    prog = [(ld, 0, 0, 4), (jeq, 1, 0, arch), (ret, 0, 0, eperm)]  # another arch: deny everything
    for i, (code, jt, jf, k) in enumerate(body):
        prog.append((code, labels[jt] - i - 1 if isinstance(jt, str) else jt, jf, k))

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
    return libc.prctl(22, 2, ctypes.byref(fprog), 0, 0) == 0  # PR_SET_SECCOMP, SECCOMP_MODE_FILTER


READ, WRITE = select.POLLIN, select.POLLOUT


class Poller:
    """The little of selectors the agent uses, over poll(2): fds with a tag, and which are ready."""

    def __init__(self):
        self.poll = select.poll()
        self.tags = {}

    def register(self, fd, events, tag):
        self.poll.register(fd, events)
        self.tags[fd] = tag

    def unregister(self, fd):
        self.poll.unregister(fd)
        del self.tags[fd]

    def select(self, timeout=None):
        """(fd, tag) of the fds that are ready (or hung up, or failed) within ``timeout`` seconds."""
        ms = None if timeout is None else -(-timeout * 1000 // 1)  # round up: never spin
        return [(fd, self.tags[fd]) for fd, _ in self.poll.poll(ms) if fd in self.tags]


class HostReader:
    """Frames from the host on fd 0."""

    def __init__(self):
        self.buf = bytearray()
        self.eof = False

    def feed(self):
        data = os.read(0, 1 << 20)
        if not data:
            self.eof = True
        self.buf += data

    def frames(self):
        while len(self.buf) >= HEAD.size:
            kind, hlen, blen = HEAD.unpack_from(self.buf)
            end = HEAD.size + hlen + blen
            if len(self.buf) < end:
                return
            header = marshal.loads(self.buf[HEAD.size : HEAD.size + hlen]) if hlen else {}
            body = bytes(self.buf[HEAD.size + hlen : end])
            del self.buf[:end]
            yield kind, header, body


class Capture:
    """One output stream of a command: the first `cap` bytes, the total, and the last RESULT line."""

    def __init__(self, cap, result_cap=0):
        self.cap, self.result_cap = cap, result_cap
        self.kept = bytearray()
        self.total = 0
        self.partial = bytearray()
        self.partial_overflow = False
        self.result = None
        self.result_overflow = False

    def add(self, data):
        self.total += len(data)
        room = self.cap - len(self.kept)
        if room > 0:
            self.kept += data[:room]
        if self.result_cap:
            self._scan(data)

    def _scan(self, data):
        nl = data.rfind(b"\n")
        if nl < 0:
            self._grow_partial(data)
            return
        first = data.find(b"\n")
        self._grow_partial(data[:first])
        self._line(bytes(self.partial), self.partial_overflow)
        self.partial.clear()
        self.partial_overflow = False
        middle = data[first + 1 : nl]
        if middle:
            at = middle.rfind(b"\nRESULT:")
            if at >= 0:
                end = middle.find(b"\n", at + 1)
                self._line(middle[at + 1 : end if end >= 0 else len(middle)], False)
            elif middle.startswith(b"RESULT:"):
                end = middle.find(b"\n")
                self._line(middle[: end if end >= 0 else len(middle)], False)
        self._grow_partial(data[nl + 1 :])

    def _grow_partial(self, data):
        room = self.result_cap - len(self.partial)
        if len(data) > room:
            self.partial_overflow = True
            data = data[: max(room, 0)]
        self.partial += data

    def _line(self, line, overflow):
        if line.startswith(b"RESULT:"):
            if overflow or len(line) > self.result_cap:
                self.result, self.result_overflow = None, True
            else:
                self.result, self.result_overflow = line, False

    def finish(self):
        if self.partial:
            self._line(bytes(self.partial), self.partial_overflow)
            self.partial.clear()


def kill_everything():
    """SIGKILL every process this user may signal but the agent and init; count the survivors."""
    me = os.getpid()
    for _ in range(50):
        try:
            os.kill(-1, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        time.sleep(0.002)
        if not others(me):
            return 0
    return len(others(me))


def others(me):
    found = []
    for name in os.listdir("/proc"):
        if name.isdigit() and int(name) not in (1, me):
            try:
                with open(f"/proc/{name}/stat", "rb") as f:
                    state = f.read().rsplit(b")", 1)[1].split()[0]
            except OSError:
                continue
            if state != b"Z":
                found.append(int(name))
    return found


class Agent:
    def __init__(self):
        self.reader = HostReader()
        self.sel = Poller()
        self.sel.register(0, READ, "host")

    def serve(self):
        send(
            b"H",
            {
                "pid": os.getpid(),
                "uid": os.getuid(),
                "gid": os.getgid(),
                "python": sys.version.split()[0],
                "booted_from": globals().get("BOOTED_FROM", "source"),
                "not_dumpable": not_dumpable(),
                "syscall_filter": install_syscall_filter(),
                "network": network_view(),
            },
        )
        while not self.reader.eof:
            for _fd, tag in self.sel.select():
                if tag == "host":
                    self.reader.feed()
            for kind, header, body in self.reader.frames():
                self.handle(kind, header, body)

    def handle(self, kind, header, body):
        try:
            if kind == b"E":
                self.execute(header, body)
            elif kind == b"W":
                self.write_file(header, body)
            elif kind == b"R":
                self.read_file(header)
            elif kind == b"L":
                self.list_files(header)
            elif kind == b"P":
                send(b"A", {"ok": True})
            elif kind in (b"K", b"T"):
                pass  # a kill or tool reply for a command that already ended
            else:
                send(b"A", {"ok": False, "error": f"unknown frame kind {kind!r}"})
        except Exception as e:  # report and keep serving; the host decides what it means
            send(b"A", {"ok": False, "error": f"{type(e).__name__}: {e}"})

    def write_file(self, header, body):
        path = header["path"]
        os.makedirs(os.path.dirname(path) or "/", exist_ok=True)
        tmp = f"{path}.sandfleet-{os.getpid()}.tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, header.get("mode", 0o644))
        try:
            view = memoryview(body)
            while view:
                view = view[os.write(fd, view) :]
        finally:
            os.close(fd)
        os.replace(tmp, path)
        send(b"A", {"ok": True, "size": len(body)})

    def read_file(self, header):
        limit = header.get("max_bytes", 64 << 20)
        with open(header["path"], "rb") as f:
            data = f.read(limit + 1)
        if len(data) > limit:
            send(b"A", {"ok": False, "error": f"file is larger than {limit} bytes"})
        else:
            send(b"A", {"ok": True, "size": len(data)}, data)

    def list_files(self, header):
        root = header.get("path", ".")
        files = []
        for base, dirs, names in os.walk(root):
            dirs.sort()
            files.extend(os.path.relpath(os.path.join(base, n), root) for n in sorted(names))
        send(b"A", {"ok": True, "files": files})

    def execute(self, req, stdin):
        started = time.monotonic()
        ooms_before = oom_kills()
        deadline = started + req["timeout"] if req.get("timeout") else None
        bridge = req.get("bridge", False)
        pass_fds = ()
        if bridge:
            call_r, call_w = os.pipe()  # program -> agent: tool calls
            reply_r, reply_w = os.pipe()  # agent -> program: replies
            pass_fds = (call_w, reply_r)
        env = dict(req.get("env", {}))
        if bridge:
            env["SANDFLEET_BRIDGE_FDS"] = f"{call_w},{reply_r}"
        script = req.get("python_script")
        in_place = bool(script) and starts_like_me(env)
        try:
            proc = Child(
                req["argv"], env, req.get("cwd") or None, bool(stdin), pass_fds, script if in_place else None
            )
        except OSError as e:
            if bridge:
                for fd in (call_r, call_w, reply_r, reply_w):
                    os.close(fd)
            send(
                b"D",
                {
                    "exit_code": 127,
                    "timed_out": False,
                    "spawn_error": f"{type(e).__name__}: {e}",
                    "forked": in_place,
                    "out_len": 0,
                    "err_len": 0,
                    "result_len": 0,
                },
            )
            return
        if stdin:
            proc.feed(stdin)
        cap = req.get("max_output", 1 << 20)
        out = Capture(cap, req.get("max_result", 0))
        err = Capture(cap)
        streams = {proc.stdout: out, proc.stderr: err}
        for fd in streams:
            os.set_blocking(fd, False)
            self.sel.register(fd, READ, "out")
        calls = None
        if bridge:
            os.close(call_w)
            os.close(reply_r)
            calls = ProgramCalls(call_r, reply_w, req.get("max_request", 1 << 20))
            calls.sync(self.sel)
        killed_by = None
        exited_at = None
        while streams or (calls and calls.open):
            timeout = None if deadline is None else max(0.0, deadline - time.monotonic())
            if streams:  # wake now and then to notice that the command exited with its pipes held
                timeout = EXIT_POLL_S if timeout is None else min(timeout, EXIT_POLL_S)
            events = self.sel.select(timeout)
            if deadline is not None and time.monotonic() >= deadline and killed_by is None:
                killed_by = "deadline"
                break
            for fd, tag in events:
                if tag == "host":
                    self.reader.feed()
                    if self.reader.eof:
                        killed_by = "host"
                elif tag == "out":
                    data = read_some(fd)
                    if data:
                        streams[fd].add(data)
                    elif data is not None:
                        self.sel.unregister(fd)
                        del streams[fd]
                elif tag == "call":
                    calls.pump()
                elif tag == "reply":
                    calls.flush()
            for kind, _header, body in self.reader.frames():
                if kind == b"K":
                    killed_by = "host"
                elif kind == b"T" and calls:
                    calls.reply(body)
                else:
                    send(b"A", {"ok": False, "error": "busy: a command is running"})
            if calls:
                calls.sync(self.sel)
            if killed_by:
                break
            if not streams and calls and calls.open and proc.poll() is not None:
                break  # the program exited; a child may hold the call pipe open, do not wait for it
            if streams and proc.poll() is not None:
                exited_at = exited_at or time.monotonic()
                if time.monotonic() - exited_at >= EXIT_GRACE_S:
                    break  # a leftover child holds the pipes; it is killed below
        survivors = 0
        if killed_by:
            survivors = kill_everything()
        code = proc.wait()
        # Children that outlive the command (daemonised, or holding the pipes) die with it.
        leftover = others(os.getpid())
        if leftover:
            survivors = kill_everything()
        for fd, capture in streams.items():  # what the killed writers left in the pipes
            data = read_some(fd)
            while data:
                capture.add(data)
                data = read_some(fd)
        for fd in list(streams):
            self.sel.unregister(fd)
        out.finish()
        if calls:
            calls.open = False
            calls.pending.clear()
            calls.sync(self.sel)
            calls.close()
        proc.close()
        result = out.result or b""
        ooms_after = oom_kills()
        send(
            b"D",
            {
                "oom_killed": ooms_before is not None and ooms_after is not None and ooms_after > ooms_before,
                "exit_code": code,
                "timed_out": killed_by == "deadline",
                "killed": bool(killed_by),
                "killed_by": killed_by,
                "survivors": survivors,
                "children_killed": len(leftover),
                "out_total": out.total,
                "err_total": err.total,
                "out_len": len(out.kept),
                "err_len": len(err.kept),
                "result_len": len(result),
                "result_overflow": out.result_overflow,
                "run_s": time.monotonic() - started,
                "forked": in_place,
            },
            bytes(out.kept) + bytes(err.kept) + result,
        )


# What CPython reads from the environment as it starts (PYTHON* but PYTHON_*, which is not its own,
# the locale, and PATH for sys.executable): a program whose environment agrees with the agent's on
# all of them would start exactly as the agent's interpreter did.
def starts_like_me(env):
    """Whether ``python3 -s`` under ``env`` would set up the interpreter the agent runs in."""
    keys = [k for k in (*env, *os.environ) if is_startup_variable(k)]
    return all(env.get(k) == os.environ.get(k) for k in keys)


def is_startup_variable(name):
    return (name.startswith("PYTHON") and not name.startswith("PYTHON_")) or name in (
        "LANG",
        "LC_ALL",
        "LC_CTYPE",
        "PATH",
    )


def become_program(path, argv):
    """In a forked child: run ``path`` as ``argv`` (``python3 -s path``) would, in this interpreter.

    The agent's interpreter started with the program's flags and environment, so what is left is
    what Python does per script: argv, sys.path[0], a fresh __main__, only the modules a fresh
    interpreter has, and the report of an uncaught exception. A script that cannot be read or
    compiled is left to the real ``argv``, which reports it in its own words. It ends with
    SystemExit, which no frame of the agent catches, so the interpreter finalizes as after any
    script: non-daemon threads joined, atexit handlers run, streams flushed, objects finalized.
    (One difference: an uncaught KeyboardInterrupt exits 1, not by SIGINT.)
    """
    try:
        with open(path, "rb") as f:
            code = compile(f.read(), path, "exec", dont_inherit=True)
    except (OSError, SyntaxError, ValueError):
        try:
            signal.signal(signal.SIGPIPE, signal.SIG_DFL)
            os.execvpe(argv[0], argv, os.environ)
        except BaseException as e:
            os.write(2, f"cannot start the command: {type(e).__name__}: {e}\n".encode())
        os._exit(127)
    fresh = STARTUP_MODULES or sys.modules
    for name in [name for name in sys.modules if name not in fresh]:
        del sys.modules[name]  # the agent's own imports: the program imports what it needs anew
    sys.argv[:] = [path]
    sys.path.insert(0, os.path.dirname(path))
    main = type(sys)("__main__")
    main.__file__, main.__cached__ = path, None
    main.__loader__ = sys.modules["_frozen_importlib_external"].SourceFileLoader("__main__", path)
    main.__builtins__ = sys.modules["builtins"]
    sys.modules["__main__"] = main
    try:
        exec(code, main.__dict__)
    except SystemExit:
        raise
    except BaseException as e:
        e.__traceback__ = e.__traceback__.tb_next  # the program's frames, not this one
        sys.excepthook(type(e), e, e.__traceback__)
        raise SystemExit(1) from None
    raise SystemExit(0)


class Child:
    """A command started the way the agent needs it, without importing subprocess (which costs a
    sandbox ~30 ms of start-up): its own session, stdout/stderr pipes, optional stdin, the bridge's
    fds passed, signals back to their defaults, everything else closed. With ``script`` the child
    does not exec: it becomes ``python3 -s script`` in place (``become_program``)."""

    def __init__(self, argv, env, cwd, want_stdin, pass_fds, script=None):
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        in_r, in_w = os.pipe() if want_stdin else (None, None)
        report_r, report_w = os.pipe2(os.O_CLOEXEC)  # says why exec failed, closes on success
        if script is not None:
            gc.freeze()  # the child need not scan (and so copy) the agent's objects
        self.pid = os.fork()
        if self.pid == 0:  # the child: set up, then exec; on any failure report and exit 127
            try:
                os.setsid()
                if cwd:
                    os.chdir(cwd)
                stdin_fd = in_r if want_stdin else os.open(os.devnull, os.O_RDONLY)
                for fd, target in ((stdin_fd, 0), (out_w, 1), (err_w, 2)):
                    os.dup2(fd, target)
                keep = {0, 1, 2, report_w, *pass_fds}
                for fd in pass_fds:
                    os.set_inheritable(fd, True)
                for name in os.listdir("/proc/self/fd"):
                    if int(name) not in keep:
                        try:
                            os.close(int(name))
                        except OSError:
                            pass
                if script is None:
                    signal.signal(signal.SIGPIPE, signal.SIG_DFL)
                    os.execvpe(argv[0], argv, env)
                os.environ.clear()
                os.environ.update(env)
                os.close(report_w)  # as exec would have: the start worked
            except BaseException as e:
                os.write(report_w, f"{type(e).__name__}: {e}".encode())
                os._exit(127)
            become_program(script, argv)  # outside the try: its SystemExit must reach the interpreter
        for fd in (out_w, err_w, report_w, *((in_r,) if want_stdin else ())):
            os.close(fd)
        self.stdout, self.stderr, self._stdin = out_r, err_r, in_w
        failure = b""
        while chunk := os.read(report_r, 4096):
            failure += chunk
        os.close(report_r)
        self.returncode = None
        if failure:
            self.wait()
            self.close()
            if want_stdin:
                os.close(in_w)
            raise OSError(failure.decode(errors="replace"))

    def feed(self, data):
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(self._stdin, view) :]
        except BrokenPipeError:
            pass
        os.close(self._stdin)

    def poll(self):
        if self.returncode is None:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def wait(self):
        if self.returncode is None:
            _, status = os.waitpid(self.pid, 0)
            self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def close(self):
        for fd in (self.stdout, self.stderr):
            try:
                os.close(fd)
            except OSError:
                pass


def read_some(fd):
    """Bytes read, b"" at end of stream, None when nothing is there yet."""
    try:
        return os.read(fd, CHUNK)
    except BlockingIOError:
        return None
    except OSError:
        return b""


def oom_kills():
    """The cgroup's count of OOM kills (v2 memory.events or v1 memory.oom_control), None if unknown."""
    for path in ("/sys/fs/cgroup/memory.events", "/sys/fs/cgroup/memory/memory.oom_control"):
        try:
            with open(path, "rb") as f:
                for line in f:
                    parts = line.split()
                    if len(parts) == 2 and parts[0] == b"oom_kill":
                        return int(parts[1])
        except (OSError, ValueError):
            continue
    return None


class ProgramCalls:
    """Length-prefixed tool calls from the program, relayed to the host as "C" frames."""

    def __init__(self, fd, reply_fd, max_request):
        self.fd, self.reply_fd, self.max_request = fd, reply_fd, max_request
        os.set_blocking(fd, False)
        self.buf = bytearray()
        self.skip = 0  # bytes of an oversized request still to discard
        self.open = True
        self.pending = bytearray()  # replies the program has not read yet
        self.outstanding = 0  # requests forwarded to the host and not answered yet
        os.set_blocking(reply_fd, False)
        self.reading = False  # registered with the selector for requests / for writing replies
        self.writing = False

    def pump(self):
        """Read requests from the program and forward the complete ones (as many as allowed)."""
        try:
            data = os.read(self.fd, 1 << 16)
        except BlockingIOError:
            return
        if not data:
            if self.buf or self.skip:
                send(b"C", {"malformed": "truncated request: the program closed the channel mid-frame"})
            self.open = False
            return
        if self.skip:
            used = min(self.skip, len(data))
            self.skip -= used
            data = data[used:]
        self.buf += data
        self.forward()

    def forward(self):
        while len(self.buf) >= PIPE_LEN.size and not self.skip and self.outstanding < MAX_OUTSTANDING_CALLS:
            (n,) = PIPE_LEN.unpack_from(self.buf)
            if n > self.max_request:
                send(b"C", {"oversize": n})
                self.outstanding += 1
                del self.buf[: PIPE_LEN.size]
                used = min(n, len(self.buf))
                del self.buf[:used]
                self.skip = n - used
                continue
            if len(self.buf) < PIPE_LEN.size + n:
                break
            send(b"C", {}, bytes(self.buf[PIPE_LEN.size : PIPE_LEN.size + n]))
            self.outstanding += 1
            del self.buf[: PIPE_LEN.size + n]

    def reply(self, body):
        """Queue a reply for the program and write what the pipe takes now (never blocks)."""
        self.outstanding = max(0, self.outstanding - 1)
        self.pending += PIPE_LEN.pack(len(body)) + body
        self.flush()
        self.forward()  # requests held back while too many were outstanding

    def flush(self):
        while self.pending:
            try:
                written = os.write(self.reply_fd, self.pending)
            except BlockingIOError:
                return
            except OSError:  # the program is gone or closed its end: nobody will read the rest
                self.pending.clear()
                return
            del self.pending[:written]

    def sync(self, sel):
        """Watch the reply pipe while replies wait; stop reading requests while too many do."""
        want_write = bool(self.pending)
        if want_write and not self.writing:
            sel.register(self.reply_fd, WRITE, "reply")
        elif self.writing and not want_write:
            sel.unregister(self.reply_fd)
        self.writing = want_write
        want_read = (
            self.open and len(self.pending) < MAX_PENDING_REPLIES and self.outstanding < MAX_OUTSTANDING_CALLS
        )
        if want_read and not self.reading:
            sel.register(self.fd, READ, "call")
        elif self.reading and not want_read:
            sel.unregister(self.fd)
        self.reading = want_read

    def close(self):
        for fd in (self.fd, self.reply_fd):
            try:
                os.close(fd)
            except OSError:
                pass


if __name__ == "__main__" or __name__ == "sandfleet_agent":
    signal.signal(signal.SIGPIPE, signal.SIG_IGN)
    Agent().serve()
