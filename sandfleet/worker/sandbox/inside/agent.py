"""The in-container agent: the sandbox's main process, spoken to over the container's stdin/stdout.

This file is sent into every container at start (it is not baked into the image) and runs there
under python3 with the standard library only. It waits for frames from the host and:
  - runs commands (one at a time) as its own process group, capturing stdout/stderr up to a cap;
    a Python program runs in a fork of the agent's own interpreter (started as ``python3 -s``, as
    programs are) when it would start the same way (``starts_like_me``): ~5 ms of CPU per run
    instead of ~13 ms for a new interpreter, out of ~45 ms a trivial job costs inside its sandbox;
  - for programs, relays tool calls between the program (two pipes) and the host;
  - writes, reads and lists files from inside (Docker's archive API cannot, on read-only roots);
  - collects the artifacts a program left under a folder (``collect``): regular files only, read
    with O_NOFOLLOW, symlinks, devices, fifos and sockets skipped, caps applied (the host checks
    every cap and size again);
  - kills everything it started when told to, or when its own copy of the deadline passes.

The frames, both ways, are defined in protocol.py, which the host ships with this file (with
syscall_filter.py: spec.boot_payload). Everything here is untrusted by the host: the program runs
as the same user and may impersonate the agent; the host enforces every cap and deadline itself.

The agent is the container's init (pid 1, no other init in front of it), which puts it out of the
program's reach where the kernel allows: Linux drops every signal sent to a pid namespace's init
from inside that namespace unless init handles it, and the agent handles none (SIGINT goes back to
the default; SIGPIPE and SIGXFSZ are ignored). gVisor's kernel does not drop them, so under runsc a
program can still kill the agent; the host then tells that from an out-of-memory kill
(engine.DockerSandbox.ended). As init the agent also reaps the orphans the program leaves.

Start-up is paid once per job, so the agent imports only built-in modules: json (through re and
enum), selectors and signal would cost a sandbox ~12 ms of CPU, about 4% of a trivial job.
"""

import gc
import os
import select
import sys
import time

try:
    import _signal as signal  # built in; the signal module adds enum wrappers this does not need
except ImportError:  # another Python implementation
    import signal

if "sandfleet_protocol" in sys.modules:  # in the sandbox: shipped with this file (spec.BOOT)
    protocol = sys.modules["sandfleet_protocol"]
    syscall_filter = sys.modules["sandfleet_syscall_filter"]
else:  # this file loaded on the host, as the tests do
    from sandfleet.worker.sandbox.inside import protocol, syscall_filter

to_json = protocol.to_json  # how the agent writes its headers (protocol.agent_frame uses it)
CALL_LENGTH = protocol.CALL_LENGTH
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


def send(kind, header=None, body=b""):
    """Write one frame to the host (fd 1), whole."""
    view = memoryview(protocol.agent_frame(kind, header, body))
    while view:
        view = view[os.write(1, view) :]


def send_parts(kind, header, parts):
    """Write one frame whose body is ``parts`` one after another, without joining them first (a
    collection of artifacts is tens of MiB: each copy costs the sandbox's one CPU)."""
    text = protocol.agent_frame(kind, header)[protocol.HEAD.size :]  # the encoded header
    for view in (
        memoryview(protocol.HEAD.pack(kind, len(text), sum(len(p) for p in parts)) + text),
        *map(memoryview, parts),
    ):
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
        head = protocol.HEAD
        while len(self.buf) >= head.size:
            kind, hlen, blen = head.unpack_from(self.buf)
            end = head.size + hlen + blen
            if len(self.buf) < end:
                return
            header = protocol.read_host_header(self.buf[head.size : head.size + hlen])
            body = bytes(self.buf[head.size + hlen : end])
            del self.buf[:end]
            yield kind, header, body


class Capture:
    """One output stream of a command: the first `cap` bytes, the total, the last RESULT line, and
    (with `tail_cap`, for shell sessions) the last `tail_cap` bytes."""

    def __init__(self, cap, result_cap=0, tail_cap=0):
        self.cap, self.result_cap, self.tail_cap = cap, result_cap, tail_cap
        self.kept = bytearray()
        self.tail = bytearray()
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
        if self.tail_cap:
            self.tail += data[-self.tail_cap :]
            del self.tail[: max(0, len(self.tail) - self.tail_cap)]
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
    """SIGKILL every process this user may signal but the agent (and init); count the survivors."""
    me = os.getpid()
    for _ in range(50):
        try:
            os.kill(-1, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        time.sleep(0.002)
        reap()
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
            protocol.HELLO,
            {
                "pid": os.getpid(),
                "uid": os.getuid(),
                "gid": os.getgid(),
                "python": sys.version.split()[0],
                "booted_from": globals().get("BOOTED_FROM", "source"),
                "not_dumpable": not_dumpable(),
                "syscall_filter": syscall_filter.install(os.uname().machine),
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
            if kind == protocol.EXECUTE:
                self.execute(header, body)
            elif kind == protocol.WRITE:
                self.write_file(header, body)
            elif kind == protocol.READ:
                self.read_file(header)
            elif kind == protocol.LIST:
                self.list_files(header)
            elif kind == protocol.COLLECT:
                self.collect(header)
            elif kind == protocol.PING:
                send(protocol.ANSWER, {"ok": True})
            elif kind in (protocol.KILL, protocol.TOOL_REPLY):
                pass  # a kill or tool reply for a command that already ended
            else:
                send(protocol.ANSWER, {"ok": False, "error": f"unknown frame kind {kind!r}"})
        except Exception as e:  # report and keep serving; the host decides what it means
            send(protocol.ANSWER, {"ok": False, "error": f"{type(e).__name__}: {e}"})

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
        send(protocol.ANSWER, {"ok": True, "size": len(body)})

    def read_file(self, header):
        limit = header.get("max_bytes", 64 << 20)
        with open(header["path"], "rb") as f:
            data = f.read(limit + 1)
        if len(data) > limit:
            send(protocol.ANSWER, {"ok": False, "error": f"file is larger than {limit} bytes"})
        else:
            send(protocol.ANSWER, {"ok": True, "size": len(data)}, data)

    def list_files(self, header):
        root = header.get("path", ".")
        files = []
        for base, dirs, names in os.walk(root):
            dirs.sort()
            files.extend(os.path.relpath(os.path.join(base, n), root) for n in sorted(names))
        send(protocol.ANSWER, {"ok": True, "files": files})

    def collect(self, header):
        """The artifacts under ``header["path"]``: one ANSWER whose body is the listing, then the
        bytes of the files kept (protocol.COLLECT)."""
        listing, data = collect_tree(
            header["path"],
            header.get("max_file", 0),
            header.get("max_total", 0),
            header.get("max_files", 0),
            header.get("max_depth", 8),
        )
        text = to_json(listing).encode("utf-8", "backslashreplace")
        if sum(len(d) for d in data) > PIPE_BYTES:
            widen_stdout()
        send_parts(protocol.ANSWER, {"ok": True, "listing_len": len(text)}, [text, *data])

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
        for folder in req.get("mkdirs", ()):  # e.g. the artifacts folder, made before the program starts
            os.makedirs(folder, exist_ok=True)
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
                protocol.DONE,
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
        tail = req.get("tail", 0)
        out = Capture(cap, req.get("max_result", 0), tail)
        err = Capture(cap, 0, tail)
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
                if kind == protocol.KILL:
                    killed_by = "host"
                elif kind == protocol.TOOL_REPLY and calls:
                    calls.reply(body)
                else:
                    send(protocol.ANSWER, {"ok": False, "error": "busy: a command is running"})
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
            protocol.DONE,
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
                "out_tail_len": len(out.tail),
                "err_tail_len": len(err.tail),
                "result_overflow": out.result_overflow,
                "run_s": time.monotonic() - started,
                "forked": in_place,
            },
            bytes(out.kept) + bytes(err.kept) + result + bytes(out.tail) + bytes(err.tail),
        )


PIPE_BYTES = 1 << 20  # the stdout pipe's size for large answers (Linux's default pipe-max-size)


def widen_stdout():
    """Grow the stdout pipe to PIPE_BYTES: a 10 MiB answer then crosses in 1 MiB steps, not 64 KiB ones."""
    try:
        import fcntl

        fcntl.fcntl(1, getattr(fcntl, "F_SETPIPE_SZ", 1031), PIPE_BYTES)
    except (ImportError, OSError):
        pass  # not a pipe, or not allowed: the default size works, only slower


MAX_SKIPPED_LISTED = 100  # skipped files named in a listing; the rest are counted


def collect_tree(root, max_file, max_total, max_files, max_depth):
    """(listing, [bytes of each kept file]) of the tree under ``root``, sorted by name.

    Nothing is followed: a symlink (the root itself included) is skipped as one, devices, fifos and
    sockets are skipped by type (lstat), and each file is opened with O_NOFOLLOW | O_NONBLOCK and
    checked again with fstat, so what is read is the regular file that was listed. A file past a cap
    is skipped with ``cap`` set; a file that changes size while read keeps the bytes read.
    """
    import stat

    files, skipped, data = [], [], []
    listing = {"files": files, "skipped": skipped, "skipped_more": 0}
    total = 0

    def skip(name, reason, size=None, cap=False):
        if len(skipped) < MAX_SKIPPED_LISTED:
            skipped.append({"name": name, "size": size, "reason": reason, "cap": cap})
        else:
            listing["skipped_more"] += 1

    try:
        top = os.lstat(root)
    except FileNotFoundError:
        return listing, data
    if not stat.S_ISDIR(top.st_mode):
        skip(".", "the artifacts folder is not a folder (a symbolic link is never followed)")
        return listing, data
    stack = [("", 0)]
    while stack:
        rel, depth = stack.pop()
        try:
            with os.scandir(os.path.join(root, rel) if rel else root) as it:
                entries = sorted(it, key=lambda e: e.name)
        except OSError as e:
            skip(rel or ".", f"cannot list it: {e.strerror}")
            continue
        folders = []
        for entry in entries:
            name = f"{rel}/{entry.name}" if rel else entry.name
            try:
                st = entry.stat(follow_symlinks=False)
            except OSError as e:
                skip(name, f"cannot read it: {e.strerror}")
                continue
            mode = st.st_mode
            if stat.S_ISLNK(mode):
                skip(name, "a symbolic link (never followed)")
            elif stat.S_ISDIR(mode):
                if depth >= max_depth:
                    skip(name, f"a folder more than {max_depth} levels deep")
                else:
                    folders.append((name, depth + 1))
            elif not stat.S_ISREG(mode):
                kind = "a fifo" if stat.S_ISFIFO(mode) else "a socket" if stat.S_ISSOCK(mode) else "a device"
                skip(name, f"{kind}, not a regular file")
            elif st.st_size > max_file:
                skip(name, f"larger than the cap of {max_file} bytes per file", st.st_size, True)
            elif total + st.st_size > max_total:
                skip(name, f"past the cap of {max_total} bytes per job", st.st_size, True)
            elif len(files) >= max_files:
                skip(name, f"past the cap of {max_files} files per job", st.st_size, True)
            else:
                body = read_regular(os.path.join(root, name), st.st_size)
                if body is None:
                    skip(name, "not a regular file when opened")
                    continue
                files.append({"name": name, "size": len(body)})
                data.append(body)
                total += len(body)
        stack.extend(reversed(folders))  # depth first, in name order
    return listing, data


def read_regular(path, size):
    """At most ``size`` bytes of the regular file at ``path`` (not through a symlink), or None."""
    import stat

    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_NOCTTY", 0))
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        # Read into one buffer of the listed size: no chunks to join (a copy the sandbox's one CPU
        # would pay for every byte).
        body = bytearray(size)
        view, got = memoryview(body), 0
        while got < size:
            n = os.readv(fd, [view[got:]])
            if not n:
                break
            got += n
        view.release()
        if got < size:
            del body[got:]  # it shrank while read: the bytes read
        return body
    finally:
        os.close(fd)


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
        self.returncode = None
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
                signal.signal(signal.SIGINT, signal.default_int_handler)  # as in a fresh interpreter
                os.environ.clear()
                os.environ.update(env)
                os.close(report_w)  # as exec would have: the start worked
            except BaseException as e:
                os.write(report_w, f"{type(e).__name__}: {e}".encode())
                os._exit(127)
            become_program(script, argv)  # outside the try: its SystemExit must reach the interpreter
        RUNNING[self.pid] = self
        for fd in (out_w, err_w, report_w, *((in_r,) if want_stdin else ())):
            os.close(fd)
        self.stdout, self.stderr, self._stdin = out_r, err_r, in_w
        failure = b""
        while chunk := os.read(report_r, 4096):
            failure += chunk
        os.close(report_r)
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
        """The exit code (-N: killed by signal N), or None while it runs. Reaps orphans too."""
        if self.returncode is None:
            reap()
        return self.returncode

    def wait(self):
        reap(until_exited=self)
        return self.returncode

    def close(self):
        for fd in (self.stdout, self.stderr):
            try:
                os.close(fd)
            except OSError:
                pass


RUNNING = {}  # pid -> Child: the commands the agent waits for, whose exit status reap() keeps


def reap(until_exited=None):
    """Collect every exited child, waiting for ``until_exited`` (a Child) if given.

    As the sandbox's init the agent inherits the orphans of every program, and each holds a pid
    (which the pids limit counts) until it is reaped; a command's own status is kept on its Child.
    """
    while True:
        blocking = until_exited is not None and until_exited.returncode is None
        try:
            pid, status = os.waitpid(-1, 0 if blocking else os.WNOHANG)
        except ChildProcessError:  # no children left
            return
        if pid == 0:
            return
        child = RUNNING.pop(pid, None)
        if child is not None:
            child.returncode = os.waitstatus_to_exitcode(status)


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
                send(
                    protocol.CALL,
                    {"malformed": "truncated request: the program closed the channel mid-frame"},
                )
            self.open = False
            return
        if self.skip:
            used = min(self.skip, len(data))
            self.skip -= used
            data = data[used:]
        self.buf += data
        self.forward()

    def forward(self):
        while (
            len(self.buf) >= CALL_LENGTH.size and not self.skip and self.outstanding < MAX_OUTSTANDING_CALLS
        ):
            (n,) = CALL_LENGTH.unpack_from(self.buf)
            if n > self.max_request:
                send(protocol.CALL, {"oversize": n})
                self.outstanding += 1
                del self.buf[: CALL_LENGTH.size]
                used = min(n, len(self.buf))
                del self.buf[:used]
                self.skip = n - used
                continue
            if len(self.buf) < CALL_LENGTH.size + n:
                break
            send(protocol.CALL, {}, bytes(self.buf[CALL_LENGTH.size : CALL_LENGTH.size + n]))
            self.outstanding += 1
            del self.buf[: CALL_LENGTH.size + n]

    def reply(self, body):
        """Queue a reply for the program and write what the pipe takes now (never blocks)."""
        self.outstanding = max(0, self.outstanding - 1)
        self.pending += CALL_LENGTH.pack(len(body)) + body
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
    signal.signal(signal.SIGINT, signal.SIG_DFL)  # handled, it would reach init from inside (module doc)
    Agent().serve()
