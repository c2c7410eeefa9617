"""The wire between the host and a sandbox's agent, defined once for both ends.

A frame is HEAD (kind, header length, body length), then the header, then the body:
- host -> agent headers are marshal data (version 4, read the same by every Python since 3.4): the
  agent reads them without importing json, and the host is trusted here;
- agent -> host headers are JSON objects, which the host parses as untrusted input, bounded by
  MAX_HEADER_BYTES (bodies by what the host allows for that frame).

The host imports this module as ``sandfleet.worker.sandbox.inside.protocol`` (channel.py, container.py).
The agent gets it shipped with itself at every container start (spec.boot_payload), registered
as ``sandfleet_protocol`` before the agent runs. So it stays standard-library only and cheap to
load in a sandbox: it imports only ``marshal`` (built in) and ``struct`` (already loaded by the boot
loader), evaluates no annotation that needs an import, and has no ``from __future__`` line (that is
a real import at run time).
"""

import marshal
import struct

TYPE_CHECKING = False  # typing costs a sandbox an import; type checkers read the names below
if TYPE_CHECKING:
    from typing import Any

HEAD = struct.Struct("!cII")  # kind (1 byte), header length, body length; network byte order
MARSHAL_VERSION = 4
MAX_HEADER_BYTES = 64 * 1024  # the largest agent header the host reads
# A program's tool calls to the agent and their replies, over two pipes: a length, then the bytes
# (the program's side is sandfleet/worker/sandbox/inside/tools_stub.py).
CALL_LENGTH = struct.Struct("!I")

# Frame kinds, host -> agent.
EXECUTE = b"E"  # run a command. Header: argv, env, cwd, timeout, caps, bridge. Body: its stdin
WRITE = b"W"  # write a file. Header: path, mode. Body: the bytes
READ = b"R"  # read a file. Header: path, max_bytes
LIST = b"L"  # list the files under a folder. Header: path
# collect the artifacts under a folder, symlinks never followed, only regular files read. Header:
# path, max_file, max_total, max_files, max_depth. Answered with ANSWER {"ok", "listing_len"}, whose
# body is the listing (JSON: {"files": [{name, size}], "skipped": [{name, size, reason, cap}]}) then
# the kept files' bytes, in listing order: raw bytes, never encoded (no base64, no JSON), so the
# host receives them in place into one buffer and hashes each file as it lands (channel.BodyWatcher).
COLLECT = b"O"
PING = b"P"  # answered with ANSWER {"ok": true}
KILL = b"K"  # kill the running command and everything it started
TOOL_REPLY = b"T"  # body: the reply to the program's oldest unanswered tool call
# Frame kinds, agent -> host.
HELLO = b"H"  # once, when the agent starts: pid, uid, python, whether its syscall filter is on
ANSWER = b"A"  # to WRITE, READ, LIST, COLLECT or PING; {"ok": false, "error": ...} refuses a frame
CALL = b"C"  # a tool call of the running program. Body: its request
DONE = b"D"  # the command ended: exit code, limits, lengths. Body: stdout, stderr, RESULT line

HOST_KINDS = frozenset((EXECUTE, WRITE, READ, LIST, COLLECT, PING, KILL, TOOL_REPLY))
AGENT_KINDS = frozenset((HELLO, ANSWER, CALL, DONE))


def pack(kind: bytes, header: bytes, body: bytes) -> bytes:
    """One frame from an encoded header and a body."""
    return HEAD.pack(kind, len(header), len(body)) + header + body


def host_frame(kind: bytes, header: "dict[str, Any] | None" = None, body: bytes = b"") -> bytes:
    """A frame for the agent; an empty or missing header takes no bytes."""
    return pack(kind, marshal.dumps(header, MARSHAL_VERSION) if header else b"", body)


def read_host_header(data: bytes) -> "dict[str, Any]":
    """The agent's reading of a host header (trusted: marshal)."""
    return marshal.loads(data) if data else {}


def agent_frame(kind: bytes, header: "dict[str, Any] | None" = None, body: bytes = b"") -> bytes:
    """A frame for the host. Lone surrogates (undecodable file names) become \\udcXX escapes."""
    return pack(kind, to_json(header or {}).encode("utf-8", "backslashreplace"), body)


def read_agent_header(data: bytes) -> "dict[str, Any]":
    """The host's reading of an agent header: a JSON object, or ValueError. Host side only."""
    import json  # not at the top: the agent never reads its own headers, and json costs it ~9 ms

    header = json.loads(data or b"{}")
    if not isinstance(header, dict):
        raise ValueError("the frame header is not a JSON object")
    return header


# JSON string escapes: control characters, quote and backslash.
_ESCAPES = {i: f"\\u{i:04x}" for i in range(32)}
_ESCAPES.update({ord('"'): '\\"', ord("\\"): "\\\\"})


def to_json(value: object) -> str:
    """JSON text of an agent header: dicts, lists, strings, numbers, booleans and None.

    The agent's own encoder: importing json (through re and enum) would cost every sandbox ~9 ms of
    CPU at start. Non-finite floats become null.
    """
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
