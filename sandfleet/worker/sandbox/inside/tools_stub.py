"""sandfleet_tools: the in-container side of the tool bridge (sent into each sandbox as a module).

`from sandfleet_tools import *` gives the program one function per tool the job allows, with the
same signature (`from sandfleet_tools import ToolError` the class of failures that have no builtin). A call is sent as JSON over a pipe the agent relays to the worker
host, where the real tool runs; the host checks the arguments against the real signature, enforces
the call cap and size limits, and replies with a value or an error, raised here with its type name
and message. Calls from several threads are served at once: each waits for the reply carrying its
own id. Nothing here is trusted by the host: rewriting this module or speaking the protocol by hand
changes nothing about what the host allows.
"""

import _thread
import builtins
import json
import os
import struct

_LEN = struct.Struct("!I")
_TOOLS = []  # filled in by the host: [{"name": ..., "signature": ..., "description": ...}]
_MAX_REQUEST = 0  # filled in by the host: the request size it accepts (bytes); 0: unknown
_fds = os.environ.pop("SANDFLEET_BRIDGE_FDS", "")
_SEND, _RECV = (int(x) for x in _fds.split(",")) if _fds else (-1, -1)
_seq = 0
_send_lock = _thread.allocate_lock()  # one request written at a time
_read_lock = _thread.allocate_lock()  # one thread reads replies at a time, for everyone
_replies = {}  # replies read for other threads, by request id


class ToolError(Exception):
    """A tool failed on the host with an error type that is not a Python builtin (an MCP tool's
    error result arrives as ToolError itself; other such types as subclasses of it)."""


class ToolDeniedError(ToolError, PermissionError):
    """A call that needs a person's approval was denied, or not approved in time (the reason is the
    message). The call did not run."""


def _error(name, message):
    """The exception to raise for a failed call: the builtin of that name, else a ToolError subclass."""
    if name == "ToolError":
        return ToolError(message)
    if name == "ToolDeniedError":
        return ToolDeniedError(message)
    builtin = getattr(builtins, name, None)
    if isinstance(builtin, type) and issubclass(builtin, Exception):
        # Some builtins (UnicodeDecodeError: 5 arguments) cannot be made from a message alone: raise a
        # class of the same name under the nearest base that can, so `except ValueError` still works.
        for base in builtin.__mro__:
            try:
                error = base(message)
            except TypeError:
                continue
            return error if base is builtin else type(name, (base,), {})(message)
    return type(name, (ToolError,), {})(message)


def _read(n):
    chunks = []
    while n:
        chunk = os.read(_RECV, min(n, 1 << 20))
        if not chunk:
            raise ConnectionError("the tool bridge closed")
        chunks.append(chunk)
        n -= len(chunk)
    return b"".join(chunks)


def _reply_for(my_id):
    """Wait for the reply to request ``my_id``; whoever holds the read lock reads for everyone."""
    while True:
        with _read_lock:
            if my_id in _replies:
                return _replies.pop(my_id)
            (size,) = _LEN.unpack(_read(_LEN.size))
            reply = json.loads(_read(size))
            reply_id = reply.get("id")
            if reply_id == my_id or reply_id is None:  # no id: a refusal of a frame the host could not read
                return reply
            _replies[reply_id] = reply


def _call(name, args, kwargs):
    global _seq
    if _SEND < 0:
        raise RuntimeError("the tool bridge is not available in this process")
    with _send_lock:
        _seq += 1
        my_id = _seq
        request = json.dumps({"id": my_id, "tool": name, "args": list(args), "kwargs": kwargs}).encode()
        if _MAX_REQUEST and len(request) > _MAX_REQUEST:  # the host refuses (and records) it by its size
            request = json.dumps({"id": my_id, "tool": name, "oversize": len(request)}).encode()
        data = _LEN.pack(len(request)) + request
        while data:
            data = data[os.write(_SEND, data) :]
    reply = _reply_for(my_id)
    if reply.get("ok"):
        return reply.get("value")
    raise _error(reply.get("type") or "ToolError", reply.get("message", "tool call failed"))


def _make(spec):
    name = spec["name"]

    def tool(*args, **kwargs):
        return _call(name, args, kwargs)

    tool.__name__ = tool.__qualname__ = name
    tool.__doc__ = spec["signature"] + ("\n\n" + spec["description"] if spec.get("description") else "")
    return tool


__all__ = []
for _spec in _TOOLS:
    globals()[_spec["name"]] = _make(_spec)
    __all__.append(_spec["name"])
