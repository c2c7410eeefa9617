"""The file side of shell mode's tools, run INSIDE the session sandbox: paths resolved there, not here.

Sent into the container before every file operation (the model could have changed an earlier copy)
and run by the agent as ``python3 -s files.py``, in a fork of the agent's own interpreter when it can
be (which runs a script without arguments: the operation comes in the environment, as
``SANDFLEET_FILES_OP``, ``_ROOT``, ``_PATH`` and ``_LIMIT``). Standard library only, built-in modules
only (no json: it costs a sandbox ~10 ms of CPU to import).

Every path is resolved with ``os.path.realpath`` in the container's own file system, symlinks,
``..`` and ``/proc/self/root`` included, and refused unless the result lies inside the workspace. The
check cannot race: the agent kills every process a command leaves behind, so nothing else runs in
the sandbox while a file operation does. Hard links cannot lead out either: the workspace is its own
tmpfs, and links across file systems fail.

Output, on stdout: one line of JSON, ``{"ok": true, ...}`` or ``{"ok": false, "error_type", "error"}``.

    read               the file's text: its first LIMIT bytes (``head``) and, for a longer file, its
                       last LIMIT // 2 (``tail``); its size. A file that is not UTF-8 text is refused.
    write              stdin becomes the file: missing folders made, written to a temporary file
                       in the same folder and renamed over the target (atomic)
    list               the folder's entries: name, kind (file, dir, symlink, other), size; at most LIMIT
"""

import os
import stat

CHUNK = 1 << 16

_ESCAPES = {i: f"\\u{i:04x}" for i in range(32)}
_ESCAPES.update({ord('"'): '\\"', ord("\\"): "\\\\"})


def to_json(value):
    """JSON text of dicts, lists, strings, whole numbers, booleans and None."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, str):
        return '"' + value.translate(_ESCAPES) + '"'
    if isinstance(value, dict):
        return "{" + ",".join(to_json(str(k)) + ":" + to_json(v) for k, v in value.items()) + "}"
    return "[" + ",".join(to_json(v) for v in value) + "]"


def say(header):
    out = to_json(header).encode("utf-8", "backslashreplace") + b"\n"
    view = memoryview(out)
    while view:
        view = view[os.write(1, view) :]


def confine(root, path):
    """``(real path, path relative to the workspace)``; PermissionError when it resolves outside."""
    if not path or "\0" in path:
        raise ValueError("a path must be a non-empty text without NUL characters")
    real_root = os.path.realpath(root)
    real = os.path.realpath(path if path.startswith("/") else os.path.join(real_root, path))
    if real != real_root and not real.startswith(real_root + "/"):
        raise PermissionError(
            f"{path!r} resolves to {real}, outside the workspace {real_root}: "
            "the sandbox file tools work inside the workspace only"
        )
    return real, os.path.relpath(real, real_root)


def read(root, path, limit):
    real, shown = confine(root, path)
    info = os.stat(real)
    if stat.S_ISDIR(info.st_mode):
        raise IsADirectoryError(f"{shown!r} is a folder: use sandbox_list_files")
    if not stat.S_ISREG(info.st_mode):
        raise OSError(f"{shown!r} is not a regular file")
    fd = os.open(real, os.O_RDONLY | os.O_NOFOLLOW)
    try:
        head = read_up_to(fd, limit)
        size, tail = len(head), b""
        more = read_up_to(fd, CHUNK)
        if more:
            window = limit // 2
            tail = more
            size += len(more)
            while True:
                chunk = read_up_to(fd, CHUNK)
                if not chunk:
                    break
                size += len(chunk)
                if window:
                    tail = (tail + chunk)[-window:]
            tail = tail[-window:] if window else b""
    finally:
        os.close(fd)
    if b"\0" in head or b"\0" in tail:
        raise ValueError(
            f"{shown!r} is not text (it holds NUL bytes): look at it with sandbox_exec (xxd, od)"
        )
    head_text = text_of(head, shown, cut_end=size > len(head))
    say(
        {
            "ok": True,
            "path": shown,
            "size": size,
            "head": head_text,
            "tail": text_of(tail, shown, cut_start=True),
        }
    )


def text_of(data, shown, cut_end=False, cut_start=False):
    """``data`` as UTF-8 text; a character cut in two at either end of a head or tail is dropped."""
    if cut_start:
        while data and (data[0] & 0xC0) == 0x80:  # continuation bytes of a character cut in two
            data = data[1:]
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        if cut_end and e.start >= len(data) - 3:
            return data[: e.start].decode("utf-8", "strict")
        raise ValueError(
            f"{shown!r} is not UTF-8 text ({e.reason} at byte {e.start}): look at it with sandbox_exec"
        ) from None


def read_up_to(fd, n):
    data = b""
    while len(data) < n:
        chunk = os.read(fd, min(CHUNK, n - len(data)))
        if not chunk:
            break
        data += chunk
    return data


def write(root, path):
    real, shown = confine(root, path)
    if os.path.isdir(real):
        raise IsADirectoryError(f"{shown!r} is a folder; give a file path inside it")
    folder = os.path.dirname(real)
    os.makedirs(folder, exist_ok=True)
    data = b""
    while True:
        chunk = os.read(0, CHUNK)
        if not chunk:
            break
        data += chunk
    tmp = os.path.join(folder, f".{os.path.basename(real)}.sandfleet-{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        os.fsync(fd)
    except BaseException:
        os.close(fd)
        os.unlink(tmp)
        raise
    os.close(fd)
    os.replace(tmp, real)
    say({"ok": True, "path": shown, "size": len(data)})


def listing(root, path, limit):
    real, shown = confine(root, path)
    if not os.path.isdir(real):
        raise NotADirectoryError(f"{shown!r} is not a folder: use sandbox_read_file")
    entries = []
    names = sorted(os.listdir(real))
    for name in names[:limit]:
        try:
            info = os.lstat(os.path.join(real, name))
        except OSError:
            continue
        mode = info.st_mode
        if stat.S_ISLNK(mode):
            entry = {
                "name": name,
                "kind": "symlink",
                "size": 0,
                "target": os.readlink(os.path.join(real, name)),
            }
        elif stat.S_ISDIR(mode):
            entry = {"name": name, "kind": "dir", "size": 0}
        elif stat.S_ISREG(mode):
            entry = {"name": name, "kind": "file", "size": info.st_size}
        else:
            entry = {"name": name, "kind": "other", "size": 0}
        entries.append(entry)
    say({"ok": True, "path": shown, "entries": entries, "left_out": max(0, len(names) - limit)})


def main(env):
    op, root, path = env["SANDFLEET_FILES_OP"], env["SANDFLEET_FILES_ROOT"], env["SANDFLEET_FILES_PATH"]
    limit = int(env.get("SANDFLEET_FILES_LIMIT") or 0)
    try:
        if op == "read":
            read(root, path, limit)
        elif op == "write":
            write(root, path)
        elif op == "list":
            listing(root, path, limit)
        else:
            raise ValueError(f"unknown operation {op!r}")
    except Exception as e:
        say({"ok": False, "error_type": type(e).__name__, "error": str(e)})


if __name__ == "__main__":
    main(os.environ)
