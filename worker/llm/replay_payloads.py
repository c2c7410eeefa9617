"""The JSON bodies the replay server sends, shaped like OpenAI's so the official client parses them.

Token figures are estimates, not a real tokenizer: a text costs ``ceil(characters / 4)`` tokens (the
usual rule of thumb for English and code), and each prompt message adds ``TOKENS_PER_MESSAGE`` for
its framing, plus ``TOKENS_REPLY_PRIMING`` per request. Good enough for load tests and usage records.
"""

from __future__ import annotations

import math
import re
import time
import uuid
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from sandfleet.worker.llm.replay_script import message_text

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


def estimate_prompt_tokens(messages: Sequence[Mapping[str, Any]]) -> int:
    """Rough token count of a prompt: every message's text plus its framing."""
    body = sum(estimate_tokens(message_text(m)) + TOKENS_PER_MESSAGE for m in messages)
    return body + TOKENS_REPLY_PRIMING


def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    """A ``usage`` object."""
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


def new_completion_id() -> str:
    """A fresh id in OpenAI's ``chatcmpl-`` style."""
    return f"chatcmpl-replay-{uuid.uuid4().hex[:24]}"


def chat_completion(*, completion_id: str, model: str, text: str, prompt_tokens: int) -> dict[str, Any]:
    """A non-streamed ``chat.completion`` holding one assistant message."""
    return {
        "id": completion_id,
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "system_fingerprint": SYSTEM_FINGERPRINT,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": text, "refusal": None},
                "finish_reason": "stop",
                "logprobs": None,
            }
        ],
        "usage": usage(prompt_tokens, estimate_tokens(text)),
    }


def chat_completion_chunks(
    *, completion_id: str, model: str, text: str, prompt_tokens: int, include_usage: bool
) -> Iterator[dict[str, Any]]:
    """The ``chat.completion.chunk`` objects of a streamed reply, in order (``[DONE]`` not included).

    The role first, then the text piece by piece, then the finish reason; with ``include_usage``
    (``stream_options.include_usage``) every chunk carries ``usage: null`` and one last chunk with no
    choices carries the figures, as OpenAI does.
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
    yield chunk({}, "stop")
    if include_usage:
        last = chunk({}, None)
        last["choices"] = []
        last["usage"] = usage(prompt_tokens, estimate_tokens(text))
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
