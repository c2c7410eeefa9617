"""Which calls need a person, and what of their arguments the person is shown. Pure functions.

The operator names gated tools in ``SANDFLEET_APPROVAL_TOOLS`` (a worker's own environment: per worker);
a job adds more in ``JobSpec.approval_tools`` and can remove none: the policy is the union. Names are
matched whole or by fnmatch globs (``send_*``, ``crm_*``), MCP tools by the names programs call them.
"""

from __future__ import annotations

import fnmatch
import inspect
from collections.abc import Iterable
from typing import Any

from sandfleet.core.redaction import REDACTED, redact

__all__ = ["REDACTED", "approval_patterns", "is_gated", "named_arguments", "redact"]


def approval_patterns(operator: Iterable[str], job: Iterable[str]) -> tuple[str, ...]:
    """The job's policy: the operator's patterns plus the job's own (never fewer)."""
    return tuple(dict.fromkeys([*operator, *job]))


def is_gated(tool: str, patterns: Iterable[str]) -> bool:
    """Whether calls of ``tool`` need an approval under ``patterns`` (case-sensitive, like tool names)."""
    return any(fnmatch.fnmatchcase(tool, pattern) for pattern in patterns)


def named_arguments(
    bound: inspect.BoundArguments | None, args: list[Any], kwargs: dict[str, Any]
) -> dict[str, Any]:
    """The call's arguments by parameter name (what an approver reads); positional ones the signature
    cannot name are shown as ``args``."""
    if bound is None:
        return {**({"args": list(args)} if args else {}), **kwargs}
    return dict(bound.arguments)
