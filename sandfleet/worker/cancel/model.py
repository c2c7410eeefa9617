"""Model calls that a cancel abandons.

An HTTP request to the model cannot be interrupted from another thread, and the endpoint may take
its whole timeout (60 s by default) to answer. So while a job runs, its model client makes each call
on a helper thread and waits for the reply *or* the job's cancel, whichever comes first. On a cancel
the call is abandoned: its reply, when it comes, is dropped, and the engine gets JobCancelledError
at once. Outside a delivery (``sandfleet ask``, tests) the client is used as it is.
"""

from __future__ import annotations

import threading
from typing import Any

from sandfleet.core.errors import JobCancelledError
from sandfleet.worker.cancel.scope import CancelToken, current_token
from sandfleet.worker.llm.client import ModelClient, ModelReply


class CancellableModelClient:
    """A ModelClient whose calls end at once when ``token`` is cancelled."""

    def __init__(self, inner: ModelClient, token: CancelToken) -> None:
        self.inner = inner
        self.token = token
        self.name = inner.name

    def complete(
        self,
        messages: list[dict[str, Any]],
        *,
        tools: list[dict[str, Any]] | None = None,
        timeout_s: float | None = None,
        **limits: Any,  # max_completion_tokens, budget_s (sandfleet/worker/llm/bounds.py): passed on as given
    ) -> ModelReply:
        self.token.raise_if_cancelled("the model call")
        outcome: dict[str, Any] = {}
        done = threading.Event()

        def call() -> None:
            try:
                outcome["reply"] = self.inner.complete(messages, tools=tools, timeout_s=timeout_s, **limits)
            except BaseException as e:  # handed to the waiting job thread, which raises it
                outcome["error"] = e
            finally:
                done.set()

        name = f"sandfleet-model-{self.token.job_id[:8]}"
        threading.Thread(target=call, name=name, daemon=True).start()
        if self.token.wait(done):
            self.token.abandoned_model_calls += int(not outcome)  # no reply nor error yet: dropped
            raise JobCancelledError(f"job {self.token.job_id} was cancelled during a model call")
        if "error" in outcome:
            raise outcome["error"]
        reply: ModelReply = outcome["reply"]
        return reply

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def cancellable(client: ModelClient) -> ModelClient:
    """``client`` bound to the current job's token (as it is when no delivery runs here)."""
    token = current_token()
    return client if token is None else CancellableModelClient(client, token)
