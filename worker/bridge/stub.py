"""sandfleet_tools: the in-container side of the tool bridge (sent into each sandbox as a module).

`from sandfleet_tools import *` gives the program one function per tool the job allows, with the
same signature. A call is sent as JSON over a pipe the agent relays to the worker host, where the
real tool runs; the host checks the arguments against the real signature, enforces the call cap
and size limits, and replies with a value or an error, raised here with its type name and message.
Nothing here is trusted by the host: rewriting this module or speaking the protocol by hand
changes nothing about what the host allows.
"""

import builtins
import json
import os
import struct

_LEN = struct.Struct("!I")
_TOOLS = []  # filled in by the host: [{"name": ..., "signature": ..., "description": ...}]
_fds = os.environ.pop("SANDFLEET_BRIDGE_FDS", "")
_SEND, _RECV = (int(x) for x in _fds.split(",")) if _fds else (-1, -1)
_seq = 0


class ToolError(Exception):
    """A tool failed on the host with an error type that is not a Python builtin."""


def _error(name, message):
    """The exception to raise for a failed call: the builtin of that name, else a ToolError subclass."""
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


def _call(name, args, kwargs):
    global _seq
    if _SEND < 0:
        raise RuntimeError("the tool bridge is not available in this process")
    _seq += 1
    request = json.dumps({"id": _seq, "tool": name, "args": list(args), "kwargs": kwargs}).encode()
    data = _LEN.pack(len(request)) + request
    while data:
        data = data[os.write(_SEND, data) :]
    (size,) = _LEN.unpack(_read(_LEN.size))
    reply = json.loads(_read(size))
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
