"""Redaction of tool-call arguments: the fields named by ``SANDFLEET_APPROVAL_REDACT`` shown as ``***``
wherever a person or an outside system sees a call. Pure functions.

What is redacted: every mapping entry whose key is a named field (case-insensitive, at any depth),
and every positional argument whose parameter has such a name (``connect_crm("ana", "hunter2")``
hides ``password`` as ``connect_crm(user="ana", password=...)`` would). Where: approval requests and
their webhook, the ``tool_call`` and ``function_call`` audit events, the records of a result. What
stays whole is the tool's own call on the host, and the digest of the whole call (``call_sha256``:
the SHA-256 of its canonical JSON, the hash an approval binds), kept beside the redacted record: the
chain still proves which call ran, and a replay or a resumed run matches its calls by that digest.

A digest of a guessable value confirms a guess: a password from a short list can be found by
hashing the list against ``call_sha256``. Redaction hides values from readers, it does not make a
weak secret strong.
"""

from __future__ import annotations

import inspect
import json
from collections.abc import Iterable
from typing import Any

from sandfleet.core import json_limits

REDACTED = "***"
WHOLE_ARGUMENTS = "(arguments)"  # the path hidden when a call's arguments text cannot be read by field


def redact(value: Any, fields: Iterable[str], path: str = "") -> tuple[Any, list[str]]:
    """``value`` with every mapping entry whose key is in ``fields`` (case-insensitive, at any depth)
    replaced by ``***``; and the dotted paths replaced (under ``path``)."""
    wanted = {f.lower() for f in fields}
    hidden: list[str] = []

    def walk(item: Any, where_from: str) -> Any:
        if isinstance(item, dict):
            out = {}
            for key, inner in item.items():
                where = f"{where_from}.{key}" if where_from else str(key)
                if str(key).lower() in wanted:
                    out[key] = REDACTED
                    hidden.append(where)
                else:
                    out[key] = walk(inner, where)
            return out
        if isinstance(item, list):
            return [walk(inner, f"{where_from}[{i}]") for i, inner in enumerate(item)]
        return item

    if not wanted:
        return value, []
    return walk(value, path), hidden


def positional_names(signature: inspect.Signature | None, count: int) -> list[str | None]:
    """The parameter name of each of ``count`` positional arguments (None past the signature)."""
    if signature is None:
        return [None] * count
    names: list[str | None] = []
    rest: str | None = None
    for param in signature.parameters.values():
        if param.kind in (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD):
            names.append(param.name)
        elif param.kind is inspect.Parameter.VAR_POSITIONAL:
            rest = param.name
    names = names[:count]
    return names + [rest] * (count - len(names))


def redact_call(
    args: list[Any], kwargs: dict[str, Any], fields: Iterable[str], names: list[str | None]
) -> tuple[list[Any], dict[str, Any], list[str]]:
    """A call's ``(args, kwargs)`` as shown, and the paths hidden. ``names``: each positional
    argument's parameter name (:func:`positional_names`); a positional argument named like a field
    is hidden whole, any other is walked like a keyword argument's value."""
    wanted = [f.lower() for f in fields]
    if not wanted:
        return args, kwargs, []
    shown_args: list[Any] = []
    hidden: list[str] = []
    for i, value in enumerate(args):
        name = names[i] if i < len(names) else None
        if name is not None and name.lower() in wanted:
            shown_args.append(REDACTED)
            hidden.append(name)
            continue
        shown, inner = redact(value, wanted, name or f"args[{i}]")
        shown_args.append(shown)
        hidden.extend(inner)
    shown_kwargs, inner = redact(kwargs, wanted)
    return shown_args, shown_kwargs, hidden + inner


def redact_arguments_text(text: str, fields: Iterable[str]) -> tuple[str, list[str]]:
    """A function call's arguments as the model sent them (JSON text, which may not parse), as shown.

    An object is redacted by field and written back as compact JSON. Text that is not an object is
    kept as it is, unless a field's name appears in it: then it is hidden whole (a secret in
    malformed JSON is still a secret)."""
    wanted = [f.lower() for f in fields]
    if not wanted or not text:
        return text, []
    try:
        value = json_limits.loads(text, "an argument", envelope=1)
    except ValueError:  # not JSON, or nested past the cap (JsonLimitError)
        value = None
    if isinstance(value, dict):
        shown, hidden = redact(value, wanted)
        if not hidden:
            return text, []
        return json.dumps(shown, ensure_ascii=False, separators=(",", ":")), hidden
    if any(name in text.lower() for name in wanted):
        return REDACTED, [WHOLE_ARGUMENTS]
    return text, []
