"""The JSON bodies the replay server sends, shaped like OpenAI's so the official client parses them.

Token figures are estimates, not a real tokenizer: a text costs ``ceil(characters / 4)`` tokens (the
usual rule of thumb for English and code), and each prompt message adds ``TOKENS_PER_MESSAGE`` for
its framing, plus ``TOKENS_REPLY_PRIMING`` per request. Good enough for load tests and usage records.
"""

from __future__ import annotations

import json
import math
import re
import time
import uuid
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from sandfleet.worker.llm.scripted.script import ScriptedToolCall, message_text

CHARS_PER_TOKEN = 4
TOKENS_PER_MESSAGE = 3
TOKENS_REPLY_PRIMING = 3
SYSTEM_FINGERPRINT = "sandfleet-replay"
REPLAY_MODEL_ID = "replay"

# Streamed replies are cut after each run of whitespace, so chunks look like a model's tokens.
_STREAM_PIECE = re.compile(r"\S+\s*|\s+")

# OpenAI's error "type" for a status; the client reads only message and code, humans read the rest.
_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    429: "rate_limit_exceeded",
}


def estimate_tokens(text: str) -> int:
    """Rough token count of a text: characters / 4, rounded up (0 for an empty text)."""
    return math.ceil(len(text) / CHARS_PER_TOKEN)


def estimate_prompt_tokens(messages: Sequence[Mapping[str, Any]], tools: Sequence[Any] | None = None) -> int:
    """Rough token count of a prompt: every message's text (tool calls' arguments included) plus its
    framing, and the JSON of the tools offered."""
    body = sum(
        estimate_tokens(message_text(m)) + estimate_tokens(_calls_text(m)) + TOKENS_PER_MESSAGE
        for m in messages
    )
    offered = estimate_tokens(json.dumps(list(tools))) if tools else 0
    return body + offered + TOKENS_REPLY_PRIMING


def _calls_text(message: Mapping[str, Any]) -> str:
    calls = message.get("tool_calls")
    if not isinstance(calls, list):
        return ""
    parts = []
    for call in calls:
        function = call.get("function") if isinstance(call, Mapping) else None
        if isinstance(function, Mapping):
            parts.append(f"{function.get('name', '')}{function.get('arguments', '')}")
    return "".join(parts)


def tool_call_objects(calls: Sequence[ScriptedToolCall], completion_id: str) -> list[dict[str, Any]]:
    """The ``tool_calls`` of an assistant message, OpenAI's shape; ids default to ``call_<n>``."""
    stem = completion_id.rsplit("-", 1)[-1][:8]
    return [
        {
            "id": call.id or f"call_{stem}_{i}",
            "type": "function",
            "function": {"name": call.name, "arguments": call.arguments},
        }
        for i, call in enumerate(calls)
    ]


def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    """A ``usage`` object."""
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


def cut_to_tokens(text: str, max_tokens: int | None) -> tuple[str, bool]:
    """``text`` cut to about ``max_tokens`` tokens (as :func:`estimate_tokens` counts them), as a real
    server stops generating at the request's limit; and whether it was cut."""
    if max_tokens is None or estimate_tokens(text) <= max_tokens:
        return text, False
    return text[: max(0, max_tokens) * CHARS_PER_TOKEN], True


def new_completion_id() -> str:
    """A fresh id in OpenAI's ``chatcmpl-`` style."""
    return f"chatcmpl-replay-{uuid.uuid4().hex[:24]}"


def chat_completion(
    *,
    completion_id: str,
    model: str,
    text: str,
    prompt_tokens: int,
    tool_calls: Sequence[ScriptedToolCall] = (),
    finish_reason: str | None = None,
) -> dict[str, Any]:
    """A non-streamed ``chat.completion`` holding one assistant message (with its tool calls, if any);
    ``finish_reason`` overrides the natural one (``length`` for a reply cut at the token limit)."""
    message: dict[str, Any] = {"role": "assistant", "content": text, "refusal": None}
    completion_tokens = estimate_tokens(text)
    if tool_calls:
        message["content"] = text or None  # OpenAI sends null content beside tool calls
        message["tool_calls"] = tool_call_objects(tool_calls, completion_id)
        completion_tokens += estimate_tokens("".join(c.name + c.arguments for c in tool_calls))
    return {
        "id": completion_id,
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "system_fingerprint": SYSTEM_FINGERPRINT,
        "choices": [
            {
                "index": 0,
                "message": message,
                "finish_reason": finish_reason or ("tool_calls" if tool_calls else "stop"),
                "logprobs": None,
            }
        ],
        "usage": usage(prompt_tokens, completion_tokens),
    }


def chat_completion_chunks(
    *,
    completion_id: str,
    model: str,
    text: str,
    prompt_tokens: int,
    include_usage: bool,
    tool_calls: Sequence[ScriptedToolCall] = (),
) -> Iterator[dict[str, Any]]:
    """The ``chat.completion.chunk`` objects of a streamed reply, in order (``[DONE]`` not included).

    The role first, then the text piece by piece, then each tool call whole (id, name and arguments in
    one delta), then the finish reason; with ``include_usage`` (``stream_options.include_usage``) every
    chunk carries ``usage: null`` and one last chunk with no choices carries the figures, as OpenAI does.
    """
    created = int(time.time())

    def chunk(delta: dict[str, Any], finish_reason: str | None) -> dict[str, Any]:
        body: dict[str, Any] = {
            "id": completion_id,
            "object": "chat.completion.chunk",
            "created": created,
            "model": model,
            "system_fingerprint": SYSTEM_FINGERPRINT,
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish_reason, "logprobs": None}],
        }
        if include_usage:
            body["usage"] = None
        return body

    yield chunk({"role": "assistant", "content": ""}, None)
    for piece in _STREAM_PIECE.findall(text):
        yield chunk({"content": piece}, None)
    for index, call in enumerate(tool_call_objects(tool_calls, completion_id)):
        yield chunk({"tool_calls": [{"index": index, **call}]}, None)
    yield chunk({}, "tool_calls" if tool_calls else "stop")
    if include_usage:
        last = chunk({}, None)
        last["choices"] = []
        calls_text = "".join(c.name + c.arguments for c in tool_calls)
        last["usage"] = usage(prompt_tokens, estimate_tokens(text) + estimate_tokens(calls_text))
        yield last


def error_body(status: int, message: str, *, code: str | None = None) -> dict[str, Any]:
    """An OpenAI-style error body: ``{"error": {"message", "type", "param", "code"}}``."""
    kind = _ERROR_TYPES.get(status, "server_error" if status >= 500 else "invalid_request_error")
    return {"error": {"message": message, "type": kind, "param": None, "code": code}}


def model_list(model_ids: Sequence[str]) -> dict[str, Any]:
    """The ``GET /v1/models`` listing."""
    created = int(time.time())
    data = [{"id": m, "object": "model", "created": created, "owned_by": "sandfleet"} for m in model_ids]
    return {"object": "list", "data": data}
