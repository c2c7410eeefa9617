"""The functions a shell or chat job's model may call, and how one call the model asked for is run.

The same rules as the bridge serves a program with (sandfleet/worker/program/bridge.py): only the job's tools,
arguments bound against the signature with Python's own ``TypeError``, the operator's call policy
consulted first, results that must become JSON. What is different is the wire: the model sends
arguments as JSON text, which may not parse; that is an error the model is told about, like any
other, never an exception of the engine.
"""

from __future__ import annotations

import inspect
import json
import time
from collections.abc import Collection
from dataclasses import dataclass
from typing import Any

from sandfleet.core import json_limits
from sandfleet.core.errors import JsonLimitError
from sandfleet.worker.engine.schemas import function_tools
from sandfleet.worker.program.bridge import CallPolicy, CallRequest, PolicyDecision, allow_all
from sandfleet.worker.tools.registry import ToolRegistry

ARGUMENTS_ERROR = (
    "ToolArgumentsError"  # the error type the model sees for arguments that are not a JSON object
)


@dataclass(frozen=True)
class CallOutcome:
    """What one call did: a JSON value, or an error's type name and message; seconds spent in the tool."""

    ok: bool
    value: Any = None
    error_type: str | None = None
    error: str | None = None
    duration_s: float = 0.0

    def text(self) -> str:
        """The tool message's content: a string result as it is, any other value as JSON, an error as
        ``Type: message``."""
        if not self.ok:
            return f"{self.error_type}: {self.error}"
        if isinstance(self.value, str):
            return self.value
        return json.dumps(self.value, ensure_ascii=False, separators=(", ", ": "))


class FunctionTable:
    """The tools one job's model may call, by name: their schemas, and a runner for the calls.

    Args:
        registry: the job's tools (already narrowed to its allow-list; shell tools included).
        policy: the operator's call policy, consulted before each call of a tool not in ``unchecked``.
        job_id: passed to the policy.
        unchecked: tools the policy does not judge (shell mode's own sandbox tools).
    """

    def __init__(
        self,
        registry: ToolRegistry,
        *,
        policy: CallPolicy = allow_all,
        job_id: str | None = None,
        unchecked: Collection[str] = (),
    ) -> None:
        self.registry = registry
        self.policy = policy
        self.job_id = job_id
        self.unchecked = frozenset(unchecked)
        self.schemas = function_tools(registry)  # raises InvalidSpecError for an unusable name

    def names(self) -> list[str]:
        return self.registry.names()

    def call(self, name: str, arguments: str, seq: int) -> CallOutcome:
        """Run one call as the model asked for it. Never raises for what the call or the tool does."""
        began = time.perf_counter()
        prepared = self.prepare(name, arguments, seq)
        if isinstance(prepared, CallOutcome):
            return prepared
        return self.run(name, *prepared, began=began)

    def prepare(self, name: str, arguments: str, seq: int) -> CallOutcome | tuple[list[Any], dict[str, Any]]:
        """The call's ``(args, kwargs)`` once its tool, its arguments and the operator's policy allow
        it; else the outcome saying why not (nothing has run)."""
        if name not in self.registry:
            allowed = ", ".join(self.registry.names()) or "none"
            return CallOutcome(
                False, error_type="NameError", error=f"no tool named {name!r}; the tools are: {allowed}"
            )
        parsed = parse_arguments(arguments)
        if isinstance(parsed, str):
            return CallOutcome(False, error_type=ARGUMENTS_ERROR, error=parsed)
        args, kwargs = split_arguments(self.registry.get(name).func, parsed)
        if name not in self.unchecked:
            decision = self.policy(CallRequest(name, args, kwargs, self.job_id, seq))
            if isinstance(decision, bool):
                decision = PolicyDecision(decision)
            if not decision.allow:
                reason = f": {decision.reason}" if decision.reason else ""
                return CallOutcome(
                    False, error_type="PermissionError", error=f"call to {name} denied by policy{reason}"
                )
        return args, kwargs

    def run(
        self, name: str, args: list[Any], kwargs: dict[str, Any], *, began: float | None = None
    ) -> CallOutcome:
        """Run a prepared call's tool; its value, or its error for the model."""
        began = time.perf_counter() if began is None else began
        try:
            value = self.registry.call(name, args, kwargs)
        except Exception as e:  # the tool's own error (or a bad call's TypeError) goes back to the model
            if type(e).__name__ == "SoftTimeLimitExceeded":  # Celery's: the job's, not the tool's
                raise
            return CallOutcome(
                False, error_type=type(e).__name__, error=_message(e), duration_s=time.perf_counter() - began
            )
        return CallOutcome(True, value=value, duration_s=time.perf_counter() - began)


def parse_arguments(text: str) -> dict[str, Any] | str:
    """The arguments object of a call, or the message explaining why the text is not one.

    An empty text is taken as no arguments (models send it for functions without parameters).
    """
    if not text or not text.strip():
        return {}
    try:
        value = json_limits.loads(text, "an argument", envelope=1)  # the object around them
    except JsonLimitError as e:
        return f"{e}; send flatter arguments"
    except ValueError as e:
        shown = text if len(text) <= 200 else text[:200] + "..."
        return f"the arguments are not valid JSON ({e}): {shown!r}; send one JSON object of named arguments"
    if not isinstance(value, dict):
        return f"the arguments must be one JSON object of named arguments, not {type(value).__name__}: {text[:200]!r}"
    return value


def split_arguments(func: Any, named: dict[str, Any]) -> tuple[list[Any], dict[str, Any]]:
    """Named arguments as ``(args, kwargs)``: positional-only parameters cannot be passed by name."""
    try:
        parameters = inspect.signature(func).parameters.values()
    except (TypeError, ValueError):
        return [], dict(named)
    kwargs = dict(named)
    args = []
    for param in parameters:
        if param.kind is not inspect.Parameter.POSITIONAL_ONLY or param.name not in kwargs:
            break
        args.append(kwargs.pop(param.name))
    return args, kwargs


def _message(e: Exception) -> str:
    if isinstance(e, KeyError) and len(e.args) == 1:
        return str(e.args[0])
    return str(e)
