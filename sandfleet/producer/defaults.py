"""Batch-wide job options: fields given once for a whole batch, which each row may override.

``sandfleet batch FILE --tools ... -o ...`` and ``Client.submit_batch(specs, tools=..., sandbox=...)``
take the same JobSpec fields as defaults. A row's own value wins; for the fields that are mappings
(``sandbox``, ``code_action``, ``tool_loop``, ``metadata``) the row's keys win key by key, so a
batch-wide ``-o memory_limit=1G`` and a row's ``{"timeout": 60}`` both apply.
"""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError

from sandfleet.core.contracts import JobSpec, describe_validation_error
from sandfleet.core.errors import InvalidSpecError

# Defaults of these fields are merged with a row's key by key; any other field a row sets replaces it.
MERGED_FIELDS = ("sandbox", "code_action", "tool_loop", "metadata", "model_limits")
# What no batch-wide default may set: a row's own question, history, and the batch (given apart).
NOT_DEFAULTS = ("question", "history", "batch_id", "schema_version")


def check_defaults(defaults: dict[str, Any]) -> dict[str, Any]:
    """``defaults`` if every key is a JobSpec field a batch may set, else InvalidSpecError naming them."""
    fields = set(JobSpec.model_fields) - set(NOT_DEFAULTS)
    unknown = sorted(set(defaults) - fields)
    if unknown:
        raise InvalidSpecError(
            f"batch-wide options {', '.join(unknown)} are not job options; use {', '.join(sorted(fields))}"
        )
    for name in MERGED_FIELDS:
        if name in defaults and not isinstance(defaults[name], dict):
            raise InvalidSpecError(
                f"batch-wide {name} must be a mapping, got {type(defaults[name]).__name__}"
            )
    try:  # a bad batch-wide value is named once, not on every row
        JobSpec.model_validate({"question": "(batch-wide options)", **defaults})
    except ValidationError as e:
        raise InvalidSpecError(f"invalid batch-wide options: {describe_validation_error(e)}") from None
    return defaults


def apply_defaults(row: dict[str, Any], defaults: dict[str, Any]) -> dict[str, Any]:
    """The row's fields over the defaults (mappings merged key by key)."""
    if not defaults:
        return row
    merged = {**defaults, **row}
    for name in MERGED_FIELDS:
        if name in defaults and isinstance(row.get(name), dict):
            merged[name] = {**defaults[name], **row[name]}
    return merged


def spec_fields(item: JobSpec | dict[str, Any] | str) -> dict[str, Any]:
    """The fields a row sets itself: a JobSpec's explicitly set ones, a dict as it is, a question."""
    if isinstance(item, JobSpec):
        return item.model_dump(exclude_unset=True)
    if isinstance(item, dict):
        return item
    return {"question": item}
