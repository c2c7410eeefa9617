"""Replay scripts: what the replay model server answers to which request. Pure: parse, validate, match.

A script is a JSON or YAML file::

    rules:
      - match: "revenue per region"     # re.search over each user message's content
        responses:                      # responses[i] answers a request holding i assistant messages
          - "first program"
          - {text: "repaired program", latency: 1.5}
          - {status: 500, error: "simulated outage"}
          - tool_calls:                 # function calls, for a tool-calling loop (text optional)
              - {name: load_orders, arguments: {}}
              - {name: read_text, arguments: '{"path": broken'}   # a string is sent as it is
          - "RESULT: the answer after the calls"
        system: "calling tools"         # optional: the rule also needs this regex in a system message
        latency: 0.2                    # optional, seconds, for this rule's text replies
        fail_first: 1                   # optional: the first N requests this rule matches fail...
        fail_status: 429                # ...with this HTTP status (default 429), then it answers
    default: ["used when no rule matches"]   # optional

Matching: a rule matches when its regex is found (``re.search``) in the content of any user message,
earlier turns of the history included, and, when it has a ``system`` regex, that one in a system
message (so one script can answer a code-action job and a chat job on the same question); the first
matching rule wins; then ``default``. Use inline flags for more (``(?i)`` ignores case, ``(?s)`` lets
``.`` cross lines).

Choosing the reply: ``responses[i]`` answers a request whose messages already contain ``i`` assistant
messages (so the first program, then the repaired one; in a tool-calling loop, each reply with tool
calls is one assistant message); past the end the last one repeats.

Tool calls: a response with ``tool_calls`` answers with those function calls (``finish_reason``
``tool_calls``), each ``{name, arguments, id}``: ``arguments`` a mapping (sent as its JSON) or a string
(sent exactly, so a script can send malformed JSON); ``id`` optional (``call_<n>_<i>`` by default).

``fail_first`` is the one piece of state: the server counts the requests each rule has matched since
it started, and the first N of them get ``fail_status`` whatever their messages. That is how a test
makes the same request fail once with 429 and then succeed on the client's retry.
"""

from __future__ import annotations

import difflib
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeGuard

import yaml

from sandfleet.core.errors import InvalidSpecError, ReplayScriptError

DEFAULT_FAIL_STATUS = 429
SIMULATED_ERROR_MESSAGE = "simulated error from the replay script"

_SCRIPT_KEYS = ("rules", "default")
_RULE_KEYS = ("match", "responses", "system", "latency", "fail_first", "fail_status")
_RESPONSE_KEYS = ("text", "tool_calls", "latency", "status", "error")
_TOOL_CALL_KEYS = ("name", "arguments", "id")


@dataclass(frozen=True)
class ScriptedToolCall:
    """One function call a scripted reply asks for; ``arguments`` is the JSON text sent as it is."""

    name: str
    arguments: str
    id: str | None = None


@dataclass(frozen=True)
class ScriptedResponse:
    """One scripted answer: a text reply (with tool calls or without), or an HTTP error (``status`` set).

    Attributes:
        text: the assistant message, for a successful reply.
        tool_calls: function calls the reply asks for.
        status: an HTTP error status (400-599) to answer with instead of a reply.
        error: the error message sent with ``status``.
        latency_s: seconds to wait before answering; ``None`` falls back to the rule's, then the server's.
    """

    text: str | None = None
    status: int | None = None
    error: str | None = None
    latency_s: float | None = None
    tool_calls: tuple[ScriptedToolCall, ...] = ()


@dataclass(frozen=True)
class ReplayRule:
    """A regex over user messages (and, optionally, one over system messages) and the answers it
    gives, by number of assistant messages."""

    pattern: re.Pattern[str]
    responses: tuple[ScriptedResponse, ...]
    system: re.Pattern[str] | None = None
    latency_s: float | None = None
    fail_first: int = 0
    fail_status: int = DEFAULT_FAIL_STATUS


@dataclass(frozen=True)
class ReplayScript:
    """A validated script. ``source`` names where it came from, for messages."""

    rules: tuple[ReplayRule, ...]
    default: tuple[ScriptedResponse, ...] | None = None
    source: str = "<script>"


def load_script(path: str | Path) -> ReplayScript:
    """Read and validate a script file: ``.json`` as JSON, anything else as YAML (a superset of JSON).

    For a file the operator named (errors quote the parser, which may quote the file); a file a job
    names is read by ``sandfleet.worker.llm.scripted.access`` instead.

    Raises:
        ReplayScriptError: the file is missing or unreadable, or the script is malformed.
    """
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        reason = e.strerror if isinstance(e, OSError) and e.strerror else e
        raise ReplayScriptError(f"cannot read replay script {path}: {reason}") from e
    return parse_script_text(text, path)


def parse_script_text(text: str, path: Path) -> ReplayScript:
    """Parse and validate the text of the script file ``path`` (JSON for ``.json``, else YAML).

    Raises:
        ReplayScriptError: the text does not parse, or the script is malformed; the message quotes
            the parser, so it is for the file's owner only.
    """
    try:
        data = json.loads(text) if path.suffix.lower() == ".json" else yaml.safe_load(text)
    except (json.JSONDecodeError, yaml.YAMLError) as e:
        raise ReplayScriptError(f"replay script {path} is not valid {_format_name(path)}: {e}") from e
    try:
        return parse_script(data, source=str(path))
    except InvalidSpecError as e:
        raise ReplayScriptError(str(e)) from e


def parse_script(data: object, *, source: str = "<script>") -> ReplayScript:
    """Validate a script already parsed from JSON or YAML.

    Raises:
        InvalidSpecError: naming the place (``rules[2].match``) and what is wrong there.
    """
    where = f"replay script {source}"
    mapping = _mapping(data, where, _SCRIPT_KEYS)
    rules_data = mapping.get("rules", [])
    if not isinstance(rules_data, list):
        raise InvalidSpecError(f"{where}: 'rules' must be a list of rules")
    rules = tuple(_parse_rule(rule, f"{where}: rules[{i}]") for i, rule in enumerate(rules_data))
    default_data = mapping.get("default")
    default = None if default_data is None else _parse_responses(default_data, f"{where}: default")
    if not rules and default is None:
        raise InvalidSpecError(f"{where}: has neither 'rules' nor 'default'; nothing could ever be answered")
    return ReplayScript(rules=rules, default=default, source=source)


def user_contents(messages: Sequence[Mapping[str, Any]]) -> list[str]:
    """The text of every user message, in order (text parts of multi-part content are joined)."""
    return [message_text(m) for m in messages if m.get("role") == "user"]


def count_assistant_messages(messages: Sequence[Mapping[str, Any]]) -> int:
    """How many assistant messages the request already holds: the index into a rule's responses."""
    return sum(1 for m in messages if m.get("role") == "assistant")


def match_rule(script: ReplayScript, messages: Sequence[Mapping[str, Any]]) -> int | None:
    """The index of the first rule whose regex is found in any user message, or ``None``."""
    texts = user_contents(messages)
    systems = [message_text(m) for m in messages if m.get("role") == "system"]
    for index, rule in enumerate(script.rules):
        if rule.system is not None and not any(rule.system.search(text) for text in systems):
            continue
        if any(rule.pattern.search(text) for text in texts):
            return index
    return None


def pick_response(responses: Sequence[ScriptedResponse], assistant_count: int) -> ScriptedResponse:
    """``responses[assistant_count]``, or the last one once the script runs out."""
    return responses[min(assistant_count, len(responses) - 1)]


def rule_response(rule: ReplayRule, hit_number: int, assistant_count: int) -> ScriptedResponse:
    """The answer of ``rule`` to its ``hit_number``-th match (0-based, counted by the server).

    The first ``fail_first`` hits answer ``fail_status``; later ones follow ``responses``.
    """
    if hit_number < rule.fail_first:
        message = f"simulated failure {hit_number + 1} of {rule.fail_first} (fail_first)"
        return ScriptedResponse(status=rule.fail_status, error=message)
    return pick_response(rule.responses, assistant_count)


def message_text(message: Mapping[str, Any]) -> str:
    """A message's content as text: a string as is, the text parts of a list of parts joined."""
    content = message.get("content")
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = [p.get("text", "") for p in content if isinstance(p, Mapping) and p.get("type") == "text"]
        return "\n".join(str(p) for p in parts)
    return ""


def _parse_rule(data: object, where: str) -> ReplayRule:
    mapping = _mapping(data, where, _RULE_KEYS)
    for key in ("match", "responses"):
        if key not in mapping:
            raise InvalidSpecError(f"{where}: missing '{key}'")
    compiled = _regex(mapping["match"], f"{where}.match")
    system = None if mapping.get("system") is None else _regex(mapping["system"], f"{where}.system")
    fail_first = mapping.get("fail_first", 0)
    if not _is_int(fail_first) or fail_first < 0:
        raise InvalidSpecError(f"{where}.fail_first: must be a whole number >= 0, got {fail_first!r}")
    return ReplayRule(
        pattern=compiled,
        responses=_parse_responses(mapping["responses"], f"{where}.responses"),
        system=system,
        latency_s=_latency(mapping.get("latency"), f"{where}.latency"),
        fail_first=fail_first,
        fail_status=_status(mapping.get("fail_status", DEFAULT_FAIL_STATUS), f"{where}.fail_status"),
    )


def _parse_responses(data: object, where: str) -> tuple[ScriptedResponse, ...]:
    if isinstance(data, str):
        raise InvalidSpecError(f"{where}: must be a list of responses; write [{data[:40]!r}] for one")
    if not isinstance(data, list) or not data:
        raise InvalidSpecError(f"{where}: must be a non-empty list of responses")
    return tuple(_parse_response(item, f"{where}[{i}]") for i, item in enumerate(data))


def _parse_response(data: object, where: str) -> ScriptedResponse:
    if isinstance(data, str):
        return ScriptedResponse(text=data)
    mapping = _mapping(data, where, _RESPONSE_KEYS, what="a text or a mapping")
    text, status, calls = mapping.get("text"), mapping.get("status"), mapping.get("tool_calls")
    replies = text is not None or calls is not None
    if replies == (status is not None):
        raise InvalidSpecError(
            f"{where}: give either 'text' and/or 'tool_calls' (a reply) or 'status' (a simulated HTTP error)"
        )
    if text is not None and not isinstance(text, str):
        raise InvalidSpecError(f"{where}.text: must be a string, got {type(text).__name__}")
    error = mapping.get("error")
    if error is not None and (status is None or not isinstance(error, str)):
        raise InvalidSpecError(f"{where}.error: a string, and only next to 'status'")
    return ScriptedResponse(
        text=text,
        status=None if status is None else _status(status, f"{where}.status"),
        error=error if status is None else (error or SIMULATED_ERROR_MESSAGE),
        latency_s=_latency(mapping.get("latency"), f"{where}.latency"),
        tool_calls=() if calls is None else _parse_tool_calls(calls, f"{where}.tool_calls"),
    )


def _parse_tool_calls(data: object, where: str) -> tuple[ScriptedToolCall, ...]:
    if not isinstance(data, list) or not data:
        raise InvalidSpecError(f"{where}: must be a non-empty list of {{name, arguments}} mappings")
    calls = []
    for i, item in enumerate(data):
        mapping = _mapping(item, f"{where}[{i}]", _TOOL_CALL_KEYS)
        name = mapping.get("name")
        if not isinstance(name, str) or not name:
            raise InvalidSpecError(f"{where}[{i}].name: must be a non-empty string, got {name!r}")
        arguments = mapping.get("arguments", {})
        if isinstance(arguments, Mapping):
            arguments = json.dumps(dict(arguments))
        elif not isinstance(arguments, str):
            raise InvalidSpecError(
                f"{where}[{i}].arguments: a mapping (sent as JSON) or a string (sent as it is), "
                f"got {type(arguments).__name__}"
            )
        call_id = mapping.get("id")
        if call_id is not None and (not isinstance(call_id, str) or not call_id):
            raise InvalidSpecError(f"{where}[{i}].id: must be a non-empty string, got {call_id!r}")
        calls.append(ScriptedToolCall(name=name, arguments=arguments, id=call_id))
    return tuple(calls)


def _regex(pattern: object, where: str) -> re.Pattern[str]:
    if not isinstance(pattern, str):
        raise InvalidSpecError(f"{where}: must be a regular expression string, got {pattern!r}")
    try:
        return re.compile(pattern)
    except re.error as e:
        raise InvalidSpecError(f"{where}: bad regular expression {pattern!r}: {e}") from e


def _mapping(data: object, where: str, known: Sequence[str], what: str = "a mapping") -> Mapping[str, Any]:
    if not isinstance(data, Mapping):
        raise InvalidSpecError(f"{where}: must be {what}, got {type(data).__name__}")
    for key in data:
        if key not in known:
            close = difflib.get_close_matches(str(key), known, n=1)
            hint = f"; did you mean '{close[0]}'?" if close else ""
            raise InvalidSpecError(f"{where}: unknown key {key!r} (known: {', '.join(known)}){hint}")
    return data


def _latency(value: object, where: str) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
        raise InvalidSpecError(f"{where}: must be a number of seconds >= 0, got {value!r}")
    return float(value)


def _status(value: object, where: str) -> int:
    if not _is_int(value) or not 400 <= value <= 599:
        raise InvalidSpecError(f"{where}: must be an HTTP error status 400-599, got {value!r}")
    return value


def _is_int(value: object) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


def _format_name(path: Path) -> str:
    return "JSON" if path.suffix.lower() == ".json" else "YAML"
