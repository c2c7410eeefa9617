"""The model client: the one module that imports ``openai``, and the place its errors become ours.

Model names are ``provider:model``:

- ``openai:NAME`` calls any OpenAI-compatible endpoint (OpenAI, vLLM, Ollama, llama.cpp, LiteLLM).
  The base URL is the per-job ``base_url`` if given, else ``settings.model_base_url``
  (``SANDFLEET_MODEL_BASE_URL`` or ``OPENAI_BASE_URL``), else OpenAI's. The key is
  ``settings.model_api_key`` (``SANDFLEET_MODEL_API_KEY`` or ``OPENAI_API_KEY``); a local server
  that needs none gets a placeholder. With neither a key nor a base URL there is nothing to call,
  so ``make_model_client`` refuses before any work starts.
- ``replay:FILE`` (or ``replay:FILE?latency=SECONDS``) starts, or reuses, this process's replay
  server for that script (see ``sandfleet.worker.llm.scripted.registry``) and calls it through the same
  ``openai`` client: the same code path as a real model. Which FILE it may name depends on who named
  the model, which the caller states (``trust``, a ``ModelTrust``): the operator of this process any
  file, a job only a file inside ``SANDFLEET_REPLAY_SCRIPTS_DIR`` (sandfleet/worker/llm/scripted/access.py).

Function calling: ``complete(messages, tools=...)`` sends OpenAI function tools (JSON schemas) and the
reply carries the calls the model asked for (``ModelReply.tool_calls``), their arguments as the raw
JSON text the model wrote, unparsed: the caller decides what a malformed one means.

Retries are ours, not the SDK's (it gets ``max_retries=0``): rate limits (429), 5xx, timeouts and
connection errors are tried again ``settings.model_max_retries`` times with jittered exponential
backoff, then raise ``ModelUnavailableError`` (the transient branch, which job retries key on). Any
other 4xx raises ``ModelError`` at once: the same request would be refused again.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol, cast
from urllib.parse import urlsplit

import openai
from openai.types.chat import ChatCompletion

from sandfleet.core.errors import InvalidSpecError, ModelError, ModelTimeBudgetError, ModelUnavailableError
from sandfleet.core.settings import Settings
from sandfleet.worker.llm.retry import RetryPolicy, compute_backoff, is_retryable_status
from sandfleet.worker.llm.scripted.access import ModelTrust
from sandfleet.worker.llm.scripted.payloads import REPLAY_MODEL_ID
from sandfleet.worker.llm.scripted.registry import parse_replay_spec, shared_replay_server
from sandfleet.worker.llm.scripted.server import REPLAY_LATENCY_HEADER

__all__ = [
    "ModelClient",
    "ModelReply",
    "ModelToolCall",
    "ModelTrust",
    "OpenAIChatClient",
    "RetryPolicy",
    "compute_backoff",
    "make_model_client",
]

logger = logging.getLogger("sandfleet.llm")

OPENAI_DEFAULT_BASE_URL = "https://api.openai.com/v1"
# Sent when the endpoint needs no key (local servers, the replay server): the SDK insists on one.
PLACEHOLDER_API_KEY = "sandfleet-no-key"
DEFAULT_REQUEST_TIMEOUT_S = 60.0  # when the SDK client's timeout is not a plain number

# What to check, by status, when the endpoint refuses a request.
_REFUSAL_HINTS = {
    401: "check the API key (OPENAI_API_KEY or SANDFLEET_MODEL_API_KEY)",
    403: "the key is not allowed to use this model",
    404: "check the model name and the base URL",
}


@dataclass(frozen=True)
class ModelToolCall:
    """One function call the model asked for: its id, the function's name, the arguments as sent (JSON text)."""

    id: str
    name: str
    arguments: str


@dataclass(frozen=True)
class ModelReply:
    """One completed model call.

    Attributes:
        text: the assistant message ("" when the endpoint sent no content).
        prompt_tokens: input tokens, as the endpoint reported them (0 if it did not).
        completion_tokens: output tokens, as the endpoint reported them (0 if it did not).
        latency_s: wall time of the whole call in seconds, failed tries and backoff included.
        model: the model that answered, as the endpoint named it.
        attempts: calls made, the successful one included (1 when nothing was retried).
        tool_calls: the function calls the reply asks for (only when tools were offered).
        finish_reason: why the model stopped (``stop``, ``tool_calls``, ``length``), as the endpoint said.
    """

    text: str
    prompt_tokens: int
    completion_tokens: int
    latency_s: float
    model: str
    attempts: int = 1
    tool_calls: tuple[ModelToolCall, ...] = ()
    finish_reason: str | None = None

    def audit_data(self, messages: list[dict[str, Any]], *, with_tool_calls: bool = False) -> dict[str, Any]:
        """The ``model_call`` audit event of this reply to ``messages`` (the new ones only), as both
        the code-action loop and the tool-calling loop record it; replay reads it back."""
        data: dict[str, Any] = {"messages": messages, "reply": self.text}
        if with_tool_calls:
            data["tool_calls"] = [
                {"id": c.id, "name": c.name, "arguments": c.arguments} for c in self.tool_calls
            ]
        return data | {
            "finish_reason": self.finish_reason,
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "latency_s": self.latency_s,
            "model": self.model,
            "tries": self.attempts,
        }


class ModelClient(Protocol):
    """Anything that turns chat messages into a reply. ``name`` is the model name it was made for."""

    name: str

    def complete(
        self,
        messages: list[dict[str, Any]],
        *,
        tools: list[dict[str, Any]] | None = None,
        timeout_s: float | None = None,
        max_completion_tokens: int | None = None,
        budget_s: float | None = None,
    ) -> ModelReply: ...


class OpenAIChatClient:
    """A ``ModelClient`` over an ``openai.OpenAI`` client (injected), with retries and error translation."""

    def __init__(
        self,
        name: str,
        model: str,
        client: openai.OpenAI,
        *,
        retry: RetryPolicy,
        sleep: Callable[[float], None] = time.sleep,
        token_limit_param: str = "max_tokens",
        headers: dict[str, str] | None = None,
    ) -> None:
        """Args:
        name: the fleet's model name (``openai:gpt-5-mini``), for messages and records.
        model: the model id sent to the endpoint (``gpt-5-mini``).
        client: an SDK client with ``max_retries=0``; retries happen here.
        retry: how many tries and how long to wait between them.
        sleep: waits between tries (seconds); injectable so a test need not wait.
        token_limit_param: the request field that carries the completion-token limit.
        headers: HTTP headers sent with every request (the replay latency), on the shared SDK client.
        """
        self.name = name
        self.token_limit_param = token_limit_param
        self.model = model
        self._client = client
        self._retry = retry
        self._sleep = sleep
        self._headers = dict(headers or {})

    def complete(
        self,
        messages: list[dict[str, Any]],
        *,
        tools: list[dict[str, Any]] | None = None,
        timeout_s: float | None = None,
        max_completion_tokens: int | None = None,
        budget_s: float | None = None,
    ) -> ModelReply:
        """Ask the model for the next assistant message.

        Args:
            messages: the conversation, OpenAI chat format (tool calls and tool results included).
            tools: OpenAI function tools the model may call (``{"type": "function", "function": ...}``).
            timeout_s: this request's timeout in seconds, when shorter than the client's own.
            max_completion_tokens: the most tokens the reply may have, sent in the request.
            budget_s: seconds this call may take in all, tries and backoff included: each try's
                timeout is bounded by what is left, and no try starts once it is spent.

        Raises:
            ModelUnavailableError: rate-limited, timed out, unreachable or 5xx on every try.
            ModelTimeBudgetError: ``budget_s`` ran out before a reply came (not worth a retry).
            ModelError: the endpoint refused the request (4xx other than 429) or sent no choice.
        """
        started = time.monotonic()
        deadline = None if budget_s is None else started + budget_s
        for attempt in range(1, self._retry.max_tries + 1):
            try_timeout = timeout_s
            if deadline is not None:
                left = deadline - time.monotonic()
                try_timeout = min(left, timeout_s if timeout_s is not None else self._timeout_s)
            try:
                response = self._create(messages, tools, try_timeout, max_completion_tokens)
            except openai.APIStatusError as e:
                if not is_retryable_status(e.status_code):
                    raise ModelError(self._refusal(e)) from e
                failure: openai.OpenAIError = e
            except openai.APIConnectionError as e:  # APITimeoutError is one of these
                failure = e
            except openai.OpenAIError as e:  # a reply the SDK could not read, for one
                raise ModelError(f"model {self.name} at {self._base_url}: {e}") from e
            else:
                return self._reply(response, time.monotonic() - started, attempt)
            delay_s = self._retry.delay_s(attempt)
            if (
                deadline is not None
                and time.monotonic() + (0 if attempt == self._retry.max_tries else delay_s) >= deadline
            ):
                raise ModelTimeBudgetError(
                    f"model {self.name} at {self._base_url}: the job's model-time budget ran out after "
                    f"{attempt} {'try' if attempt == 1 else 'tries'} ({time.monotonic() - started:.1f} s "
                    f"in this call): {self._describe(failure, try_timeout)}"
                ) from failure
            if attempt == self._retry.max_tries:
                raise ModelUnavailableError(
                    f"model {self.name} at {self._base_url} is unavailable after {attempt} "
                    f"{'try' if attempt == 1 else 'tries'}: {self._describe(failure, try_timeout)}"
                ) from failure
            logger.warning(
                "model %s: %s; try %d of %d in %.2f s",
                self.name, self._describe(failure, try_timeout), attempt + 1, self._retry.max_tries, delay_s,
            )  # fmt: skip
            self._sleep(delay_s)
        raise AssertionError("unreachable: the loop returns or raises")  # pragma: no cover

    @property
    def _base_url(self) -> str:
        return str(self._client.base_url).rstrip("/")

    @property
    def _timeout_s(self) -> float:
        timeout = self._client.timeout
        return float(timeout) if isinstance(timeout, int | float) else DEFAULT_REQUEST_TIMEOUT_S

    def _create(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None,
        timeout_s: float | None,
        max_completion_tokens: int | None,
    ) -> ChatCompletion:
        """``chat.completions.create`` without the SDK's transform of the request: the same POST
        through the SDK's documented ``post``, read into the same ChatCompletion, raising the same
        errors. The transform walks the typed parameters of every message (~0.4 ms of the worker's
        CPU a call, a third of the client's); these messages and tools are plain JSON already."""
        body: dict[str, Any] = {"model": self.model, "messages": messages}
        if tools:
            body["tools"] = tools
        if max_completion_tokens is not None:
            body[self.token_limit_param] = max_completion_tokens
        options: dict[str, Any] = {}
        if timeout_s is not None:
            options["timeout"] = max(0.1, timeout_s)
        if self._headers:
            options["headers"] = self._headers
        return self._client.post(
            "/chat/completions", body=body, cast_to=ChatCompletion, options=cast(Any, options)
        )

    def _reply(self, response: Any, latency_s: float, attempts: int) -> ModelReply:
        if not response.choices:
            raise ModelError(f"model {self.name} at {self._base_url} sent a reply with no choices")
        usage = response.usage
        choice = response.choices[0]
        return ModelReply(
            text=choice.message.content or "",
            prompt_tokens=(usage.prompt_tokens or 0) if usage else 0,
            completion_tokens=(usage.completion_tokens or 0) if usage else 0,
            latency_s=latency_s,
            model=response.model or self.model,
            attempts=attempts,
            tool_calls=tuple(_tool_calls(choice.message)),
            finish_reason=choice.finish_reason,
        )

    def _refusal(self, e: openai.APIStatusError) -> str:
        hint = _REFUSAL_HINTS.get(e.status_code)
        suffix = f" ({hint})" if hint else ""
        return f"model {self.name} at {self._base_url} refused the request: {self._describe(e)}{suffix}"

    def _describe(self, e: openai.OpenAIError, timeout_s: float | None = None) -> str:
        if isinstance(e, openai.APIStatusError):
            return f"HTTP {e.status_code}: {_error_message(e)}"
        if isinstance(e, openai.APITimeoutError):
            return f"timed out after {timeout_s if timeout_s is not None else self._client.timeout:.3g} s"
        cause = e.__cause__ or e
        return f"cannot connect: {type(cause).__name__}: {cause}"


def make_model_client(
    model: str,
    settings: Settings,
    *,
    trust: ModelTrust = ModelTrust.SUBMITTER,
    base_url: str | None = None,
    retry: RetryPolicy | None = None,
) -> ModelClient:
    """The client for a ``provider:model`` name; nothing is called yet.

    Args:
        model: ``openai:NAME``, ``replay:FILE`` or ``replay:FILE?latency=SECONDS``.
        settings: key, base URL, request timeout, retry count, the replay scripts folder.
        trust: who named the model. ``OPERATOR`` (this process's own user) lets ``replay:`` name
            any file; ``SUBMITTER`` (a job's field, the default so that forgetting fails closed)
            only a file inside ``settings.replay_scripts_dir``.
        base_url: this job's endpoint, ahead of the settings' (not for ``replay:``).
        retry: overrides the retry policy built from the settings (tests use short waits).

    Raises:
        InvalidSpecError: a malformed name, an unknown provider, no key and no base URL, or a
            replay script that is missing, out of reach or malformed.
    """
    provider, colon, rest = model.partition(":")
    if not colon or not provider or not rest:
        raise InvalidSpecError(
            f"model name {model!r} must be provider:model, e.g. openai:gpt-5-mini "
            f"(known providers: {', '.join(_PROVIDERS)})"
        )
    factory = _PROVIDERS.get(provider)
    if factory is None:
        raise InvalidSpecError(
            f"unknown model provider {provider!r} in {model!r}; known providers: {', '.join(_PROVIDERS)}"
        )
    return factory(model, rest, settings, base_url, retry or RetryPolicy.from_settings(settings), trust)


def _openai_provider(
    name: str, model: str, settings: Settings, base_url: str | None, retry: RetryPolicy, trust: ModelTrust
) -> ModelClient:
    url = base_url or settings.model_base_url
    key = settings.model_api_key
    if not key and not url:
        raise InvalidSpecError(
            f"model {name} needs an API key or a base URL: set OPENAI_API_KEY for OpenAI, or "
            "OPENAI_BASE_URL (or SANDFLEET_MODEL_BASE_URL) for an OpenAI-compatible server, "
            "or use a replay:FILE model"
        )
    # The base URL is always passed, so the SDK never reads the environment behind the settings' back.
    url = url or OPENAI_DEFAULT_BASE_URL
    sdk = _shared_sdk_client(key or PLACEHOLDER_API_KEY, url, settings)
    return OpenAIChatClient(name, model, sdk, retry=retry, token_limit_param=token_limit_param(settings, url))


def _replay_provider(
    name: str, spec: str, settings: Settings, base_url: str | None, retry: RetryPolicy, trust: ModelTrust
) -> ModelClient:
    if base_url:
        raise InvalidSpecError(f"model {name} runs its own replay server; it takes no base URL ({base_url})")
    script, latency_s = parse_replay_spec(spec)
    server = shared_replay_server(script, trust=trust, scripts_dir=settings.replay_scripts_dir)
    # Never send the real key to the local server. One SDK client per server, whatever the latency:
    # the latency travels in a header of each request, so it opens no connection of its own.
    sdk = _shared_sdk_client(PLACEHOLDER_API_KEY, server.base_url, settings)
    param = token_limit_param(settings, server.base_url)
    headers = {} if latency_s is None else {REPLAY_LATENCY_HEADER: repr(latency_s)}
    return OpenAIChatClient(name, REPLAY_MODEL_ID, sdk, retry=retry, token_limit_param=param, headers=headers)


def token_limit_param(settings: Settings, base_url: str) -> str:
    """The request field carrying the completion-token limit: the setting, or for ``auto``
    ``max_completion_tokens`` on OpenAI's own API (its reasoning models refuse ``max_tokens``) and
    ``max_tokens`` elsewhere (what llama.cpp, vLLM, Ollama and LiteLLM all read)."""
    if settings.model_token_limit_param != "auto":
        return settings.model_token_limit_param
    host = (urlsplit(base_url).hostname or "").lower()
    return "max_completion_tokens" if host == "api.openai.com" else "max_tokens"


_ProviderFactory = Callable[[str, str, Settings, "str | None", RetryPolicy, ModelTrust], ModelClient]
_PROVIDERS: dict[str, _ProviderFactory] = {"openai": _openai_provider, "replay": _replay_provider}

# One SDK client (one connection pool) per endpoint, shared by every job of the process.
_sdk_lock = threading.Lock()
_sdk_clients: dict[tuple[str, str, float], openai.OpenAI] = {}


def _shared_sdk_client(api_key: str, base_url: str, settings: Settings) -> openai.OpenAI:
    key = (api_key, base_url, settings.model_request_timeout_s)
    with _sdk_lock:
        client = _sdk_clients.get(key)
        if client is None:
            client = openai.OpenAI(
                api_key=api_key, base_url=base_url, timeout=settings.model_request_timeout_s, max_retries=0
            )
            _sdk_clients[key] = client
        return client


def _error_message(e: openai.APIStatusError) -> str:
    """The endpoint's own message from an OpenAI-style error body, else the SDK's summary."""
    body = e.body
    if isinstance(body, dict) and isinstance(body.get("message"), str):
        return body["message"]
    return e.message


def _tool_calls(message: Any) -> list[ModelToolCall]:
    """The function calls of an SDK message; a call of another kind is kept under its kind's name."""
    calls = []
    for call in getattr(message, "tool_calls", None) or []:
        function = getattr(call, "function", None)
        name = getattr(function, "name", None) or f"<{getattr(call, 'type', 'unknown')} call>"
        arguments = getattr(function, "arguments", None)
        calls.append(ModelToolCall(id=call.id or "", name=name, arguments=arguments or ""))
    return calls
