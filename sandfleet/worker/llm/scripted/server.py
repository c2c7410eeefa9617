"""The replay model server: a real OpenAI-compatible HTTP server that answers from a script.

It lets tests, the offline demo and load tests run the fleet's real model path (the official
``openai`` client over HTTP) with no model behind it. What it answers is described in
``sandfleet.worker.llm.scripted.script``; the bodies it sends in ``sandfleet.worker.llm.scripted.payloads``.

Endpoints (enough for the official client, unchanged):

- ``POST /v1/chat/completions``: a ``chat.completion``, or with ``"stream": true`` server-sent events
  (``chat.completion.chunk`` objects, then ``data: [DONE]``; the usage chunk is sent when
  ``stream_options.include_usage`` is set). A request no rule matches, with no ``default`` in the
  script, gets HTTP 400 with an OpenAI-style error body.
- ``GET /v1/models``: lists one model, ``replay`` (any model name is accepted in requests and echoed).

Latency: each reply waits ``latency`` seconds in its own handler thread before answering, taken from
the response entry, else its rule, else the request's ``X-Sandfleet-Replay-Latency`` header (what a
``replay:FILE?latency=S`` model name sends; at most ``MAX_REQUEST_LATENCY_S``), else the server-wide
``latency_s``. Every connection has its own thread, so many slow requests are in flight at once
(hundreds, bounded by threads and sockets).

Simulated failures (``{"status": 429}`` entries and ``fail_first``) answer with that HTTP status and
an OpenAI-style error body, after the same latency. A request no rule matches is refused at once.

Every chat request body is recorded as received (``ReplayServer.requests()``, the last
``MAX_RECORDED_REQUESTS``), so a test can assert on what a client sent (its completion-token limit,
its tools). A request's ``max_completion_tokens`` (or ``max_tokens``) is honoured as a real server
honours it: a longer scripted text is cut there and the reply's ``finish_reason`` is ``length``.

Function calling is checked as OpenAI checks it: an assistant message with ``tool_calls`` must be
followed by one ``tool`` message per call id, and a ``tool`` message must answer such a call;
otherwise HTTP 400 (``invalid_tool_messages``), so a client's tool loop is held to the real protocol.
"""

from __future__ import annotations

import collections
import contextlib
import json
import logging
import math
import socket
import socketserver
import sys
import threading
import time
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import TracebackType
from typing import Any
from urllib.parse import urlsplit

from sandfleet.core.errors import InvalidSpecError
from sandfleet.worker.llm.scripted import payloads
from sandfleet.worker.llm.scripted.script import (
    ReplayScript,
    ScriptedResponse,
    count_assistant_messages,
    load_script,
    match_rule,
    pick_response,
    rule_response,
)

logger = logging.getLogger("sandfleet.llm.replay")

DEFAULT_HOST = "127.0.0.1"
# Pending connections the kernel queues before accept(); the default of 5 drops bursts of clients.
LISTEN_BACKLOG = 1024
# An idle keep-alive connection is closed after this long, so its thread does not wait forever.
IDLE_CONNECTION_TIMEOUT_S = 60.0
MAX_REQUEST_BYTES = 32 * 1024 * 1024
MAX_RECORDED_REQUESTS = 10_000
NO_MATCH_MESSAGE = "no replay rule matches the request and the script has no default"
# The latency of one request, in seconds, from its client (``replay:FILE?latency=S``). Capped at the
# default model request timeout: a longer wait could only time out, and would hold its handler thread
# asleep after the client gave up.
REPLAY_LATENCY_HEADER = "X-Sandfleet-Replay-Latency"
MAX_REQUEST_LATENCY_S = 60.0


@dataclass(frozen=True)
class ReplayStats:
    """Counters since the server started: chat requests received, and how many were in flight."""

    requests: int = 0
    in_flight: int = 0
    peak_in_flight: int = 0


class _ReplayState:
    """What the handler threads share: the script, the per-rule hit counters and the stats."""

    def __init__(self, script: ReplayScript, latency_s: float) -> None:
        self.script = script
        self.latency_s = latency_s
        self._lock = threading.Lock()
        self._rule_hits = [0] * len(script.rules)
        self._requests = 0
        self._in_flight = 0
        self._peak_in_flight = 0
        self._received: collections.deque[dict[str, Any]] = collections.deque(maxlen=MAX_RECORDED_REQUESTS)

    def record(self, request: dict[str, Any]) -> None:
        with self._lock:
            self._received.append(request)

    def received(self) -> list[dict[str, Any]]:
        with self._lock:
            return list(self._received)

    def choose(
        self, messages: list[dict[str, Any]], request_latency_s: float | None = None
    ) -> tuple[ScriptedResponse | None, float]:
        """The scripted response for a request and the seconds to wait before sending it
        (``request_latency_s``: what the request asked for, ahead of the server's own)."""
        index = match_rule(self.script, messages)
        assistant_count = count_assistant_messages(messages)
        if index is None:
            if self.script.default is None:
                return None, 0.0
            response = pick_response(self.script.default, assistant_count)
            return response, _first_set(response.latency_s, request_latency_s, self.latency_s)
        rule = self.script.rules[index]
        with self._lock:
            hit_number = self._rule_hits[index]
            self._rule_hits[index] += 1
        response = rule_response(rule, hit_number, assistant_count)
        return response, _first_set(response.latency_s, rule.latency_s, request_latency_s, self.latency_s)

    def enter(self) -> None:
        with self._lock:
            self._requests += 1
            self._in_flight += 1
            self._peak_in_flight = max(self._peak_in_flight, self._in_flight)

    def leave(self) -> None:
        with self._lock:
            self._in_flight -= 1

    def stats(self) -> ReplayStats:
        with self._lock:
            return ReplayStats(self._requests, self._in_flight, self._peak_in_flight)


class _ReplayHTTPServer(ThreadingHTTPServer):
    """A threading HTTP server that knows its open connections, so ``stop()`` can close them."""

    daemon_threads = True
    request_queue_size = LISTEN_BACKLOG

    def __init__(self, host: str, port: int, state: _ReplayState) -> None:
        self.address_family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self.state = state
        self._connections: set[socket.socket] = set()
        self._connections_lock = threading.Lock()
        super().__init__((host, port), _ReplayHandler)

    def server_bind(self) -> None:
        # HTTPServer.server_bind resolves the host's FQDN, a DNS lookup that can stall offline hosts.
        socketserver.TCPServer.server_bind(self)
        self.server_name, self.server_port = str(self.server_address[0]), int(self.server_address[1])

    def process_request(self, request: Any, client_address: Any) -> None:
        with self._connections_lock:
            self._connections.add(request)
        super().process_request(request, client_address)

    def shutdown_request(self, request: Any) -> None:
        with self._connections_lock:
            self._connections.discard(request)
        super().shutdown_request(request)

    def handle_error(self, request: Any, client_address: Any) -> None:
        # Clients drop keep-alive connections at will (a reset while waiting for the next request);
        # that is routine, not worth socketserver's traceback on stderr.
        if isinstance(sys.exc_info()[1], ConnectionError):
            logger.debug("connection from %s dropped", client_address)
        else:
            logger.exception("replay server: error on the connection from %s", client_address)

    def close_connections(self) -> None:
        """Cut every open connection: idle keep-alive readers wake up, slow replies fail to send."""
        with self._connections_lock:
            connections = list(self._connections)
        for connection in connections:
            with contextlib.suppress(OSError):  # already closed by its client
                connection.shutdown(socket.SHUT_RDWR)


class _ReplayHandler(BaseHTTPRequestHandler):
    """One connection (HTTP/1.1 keep-alive); its requests are answered on this thread."""

    server: _ReplayHTTPServer
    protocol_version = "HTTP/1.1"
    server_version = "SandfleetReplay/1"
    timeout = IDLE_CONNECTION_TIMEOUT_S
    # Headers and body go out in two writes; with Nagle's algorithm the body then waits for the
    # client's delayed ACK of the headers: ~40 ms added to every reply on Linux (measured: 48 ms
    # per request of a zero-latency script, against ~2 ms with TCP_NODELAY).
    disable_nagle_algorithm = True

    def do_GET(self) -> None:
        path = urlsplit(self.path).path.rstrip("/")
        if path == "/v1/models":
            self._send_json(200, payloads.model_list([payloads.REPLAY_MODEL_ID]))
        else:
            self._send_error(404, f"no such endpoint: GET {path}", code="not_found")

    def do_POST(self) -> None:
        path = urlsplit(self.path).path.rstrip("/")
        try:
            raw = self._read_body()  # read even for a wrong path, or it is taken for the next request
            if path != "/v1/chat/completions":
                self._send_error(404, f"no such endpoint: POST {path}", code="not_found")
                return
            request = _parse_json_object(raw)
        except ValueError as e:
            self._send_error(400, str(e))
            return
        state = self.server.state
        state.record(request)
        state.enter()
        try:
            self._answer_chat(request)
        except ConnectionError:  # broken pipe or reset: the client gave up (its timeout) or went away
            logger.debug("client went away before its reply was sent")
            self.close_connection = True
        except Exception as e:  # a bug here must still answer, or the client waits for its timeout
            logger.exception("replay server failed on a request")
            self.close_connection = True  # a stream may be half sent; this connection is done either way
            self._send_error(500, f"replay server error: {type(e).__name__}: {e}")
        finally:
            state.leave()

    def _answer_chat(self, request: dict[str, Any]) -> None:
        messages = request.get("messages")
        if not isinstance(messages, list) or not all(isinstance(m, dict) for m in messages):
            self._send_error(400, "'messages' must be a list of message objects", code="invalid_messages")
            return
        problem = tool_message_problem(messages)
        if problem:
            self._send_error(400, problem, code="invalid_tool_messages")
            return
        try:
            request_latency_s = request_latency(self.headers.get(REPLAY_LATENCY_HEADER))
        except ValueError as e:
            self._send_error(400, str(e), code="invalid_latency")
            return
        response, latency_s = self.server.state.choose(messages, request_latency_s)
        if response is None:
            self._send_error(400, NO_MATCH_MESSAGE, code="no_replay_rule")
            return
        if latency_s > 0:
            time.sleep(latency_s)
        if response.status is not None:
            self._send_error(response.status, response.error or "simulated error", code="replay_simulated")
            return
        asked = request.get("model")
        model = asked if isinstance(asked, str) else payloads.REPLAY_MODEL_ID
        tools = request.get("tools") if isinstance(request.get("tools"), list) else None
        completion_id = payloads.new_completion_id()
        limit = request.get("max_completion_tokens", request.get("max_tokens"))
        text, cut = payloads.cut_to_tokens(response.text or "", limit if isinstance(limit, int) else None)
        prompt_tokens = payloads.estimate_prompt_tokens(messages, tools)
        if request.get("stream"):
            options = request.get("stream_options")
            include_usage = isinstance(options, dict) and bool(options.get("include_usage"))
            chunks = payloads.chat_completion_chunks(
                completion_id=completion_id,
                model=model,
                text=text,
                prompt_tokens=prompt_tokens,
                include_usage=include_usage,
                tool_calls=response.tool_calls,
            )
            self._send_stream(chunks)
        else:
            body = payloads.chat_completion(
                completion_id=completion_id,
                model=model,
                text=text,
                prompt_tokens=prompt_tokens,
                tool_calls=response.tool_calls,
                finish_reason="length" if cut else None,
            )
            self._send_json(200, body)

    def _read_body(self) -> bytes:
        length_header = self.headers.get("Content-Length")
        if length_header is None:
            self.close_connection = True
            raise ValueError("the request needs a Content-Length header")
        try:
            length = int(length_header)
        except ValueError:
            self.close_connection = True
            raise ValueError(f"bad Content-Length header: {length_header!r}") from None
        if length > MAX_REQUEST_BYTES:
            self.close_connection = True
            raise ValueError(f"request body over {MAX_REQUEST_BYTES} bytes")
        return self.rfile.read(length) if length > 0 else b""

    def _send_stream(self, chunks: Any) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream; charset=utf-8")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        for chunk in chunks:
            self._write_http_chunk(f"data: {json.dumps(chunk)}\n\n".encode())
        self._write_http_chunk(b"data: [DONE]\n\n")
        self.wfile.write(b"0\r\n\r\n")

    def _write_http_chunk(self, data: bytes) -> None:
        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))

    def _send_json(self, status: int, body: dict[str, Any]) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _send_error(self, status: int, message: str, *, code: str | None = None) -> None:
        self._send_json(status, payloads.error_body(status, message, code=code))

    def log_message(self, format: str, *args: Any) -> None:
        logger.debug("%s %s", self.address_string(), format % args)


class ReplayServer:
    """An OpenAI-compatible server answering from a replay script, served from a daemon thread.

    The constructor only stores its arguments; ``start()`` binds and serves. Use it as a context
    manager in tests::

        with ReplayServer(load_script("script.yaml")) as server:
            client = openai.OpenAI(base_url=server.base_url, api_key="unused")
    """

    def __init__(
        self, script: ReplayScript, *, host: str = DEFAULT_HOST, port: int = 0, latency_s: float = 0.0
    ) -> None:
        """Args:
        script: what to answer (see ``sandfleet.worker.llm.scripted.script``).
        host: the address to listen on.
        port: the TCP port; 0 picks a free one.
        latency_s: seconds every reply waits, unless its rule or response sets its own.
        """
        self.script = script
        self.host = host
        self.port = port
        self.latency_s = latency_s
        self._httpd: _ReplayHTTPServer | None = None
        self._state: _ReplayState | None = None
        self._thread: threading.Thread | None = None

    @classmethod
    def from_file(
        cls, path: str | Path, *, host: str = DEFAULT_HOST, port: int = 0, latency_s: float = 0.0
    ) -> ReplayServer:
        """A server for a script file, loaded and validated now (raises InvalidSpecError)."""
        return cls(load_script(path), host=host, port=port, latency_s=latency_s)

    def start(self) -> str:
        """Bind, serve in a daemon thread, and return the base URL (``http://HOST:PORT/v1``).

        Raises:
            InvalidSpecError: a negative latency.
            OSError: the address cannot be bound (port taken, no such interface).
        """
        if self._httpd is not None:
            raise RuntimeError("this ReplayServer is already started")
        if self.latency_s < 0:
            raise InvalidSpecError(f"replay server latency must be >= 0 seconds, got {self.latency_s}")
        self._state = _ReplayState(self.script, self.latency_s)
        httpd = _ReplayHTTPServer(self.host, self.port, self._state)
        self.port = int(httpd.server_address[1])
        self._httpd = httpd
        self._thread = threading.Thread(
            target=httpd.serve_forever,
            kwargs={"poll_interval": 0.1},
            name=f"replay-server-{self.port}",
            daemon=True,
        )
        self._thread.start()
        logger.info("replay server for %s listening on %s", self.script.source, self.base_url)
        return self.base_url

    @property
    def base_url(self) -> str:
        """The URL to give an OpenAI client, ``http://HOST:PORT/v1``, reachable from this host."""
        if self._httpd is None:
            raise RuntimeError("the ReplayServer is not started")
        host = {"0.0.0.0": "127.0.0.1", "::": "::1", "": "127.0.0.1"}.get(self.host, self.host)
        if ":" in host:
            host = f"[{host}]"
        return f"http://{host}:{self.port}/v1"

    def stats(self) -> ReplayStats:
        """Counters since the last start (kept after stop): chat requests, in flight, most at once."""
        return self._state.stats() if self._state is not None else ReplayStats()

    def requests(self) -> list[dict[str, Any]]:
        """The chat request bodies received since the last start, oldest first (JSON as sent)."""
        return self._state.received() if self._state is not None else []

    def stop(self) -> None:
        """Stop serving, close the socket and cut open connections. Safe to call twice."""
        httpd, thread = self._httpd, self._thread
        self._httpd = self._thread = None
        if httpd is None:
            return
        httpd.shutdown()
        httpd.server_close()
        httpd.close_connections()
        if thread is not None:
            thread.join(timeout=5)

    def __enter__(self) -> ReplayServer:
        self.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()


def tool_message_problem(messages: list[dict[str, Any]]) -> str | None:
    """What breaks OpenAI's tool-message rules in a conversation, or None when it keeps them.

    Every call id of an assistant message's ``tool_calls`` must be answered by a ``tool`` message
    (``tool_call_id``) before the next non-tool message; a ``tool`` message must answer such a call.
    """
    waiting: list[str] = []
    for index, message in enumerate(messages):
        role = message.get("role")
        if role == "tool":
            call_id = message.get("tool_call_id")
            if call_id not in waiting:
                return (
                    f"messages[{index}]: a 'tool' message must answer a preceding assistant message's "
                    f"tool call; no call {call_id!r} is waiting"
                )
            waiting.remove(call_id)
            continue
        if waiting:
            return (
                f"messages[{index}]: an assistant message with 'tool_calls' must be followed by tool "
                f"messages answering each 'tool_call_id'; missing: {', '.join(waiting)}"
            )
        calls = message.get("tool_calls") if role == "assistant" else None
        if isinstance(calls, list):
            waiting = [str(call.get("id")) for call in calls if isinstance(call, dict)]
    if waiting:
        return f"the last assistant message's tool calls have no answers: {', '.join(waiting)}"
    return None


def request_latency(header: str | None) -> float | None:
    """The seconds a request's latency header asks for (None without one).

    Raises:
        ValueError: not a number from 0 to ``MAX_REQUEST_LATENCY_S``.
    """
    if header is None:
        return None
    try:
        seconds = float(header)
    except ValueError:
        seconds = math.nan
    if not 0 <= seconds <= MAX_REQUEST_LATENCY_S:  # also refuses nan
        raise ValueError(
            f"{REPLAY_LATENCY_HEADER} must be a number of seconds from 0 to {MAX_REQUEST_LATENCY_S:g}, "
            f"got {header[:40]!r}"
        )
    return seconds


def _parse_json_object(raw: bytes) -> dict[str, Any]:
    """A request body as a JSON object (ValueError with a message for the client otherwise)."""
    try:
        body = json.loads(raw) if raw else None
    except json.JSONDecodeError as e:
        raise ValueError(f"the request body is not valid JSON: {e}") from e
    if not isinstance(body, dict):
        raise ValueError("the request body must be a JSON object")
    return body


def _first_set(*values: float | None) -> float:
    """The first value that is not None (latency falls back from response to rule to server)."""
    return next((v for v in values if v is not None), 0.0)
