"""Pydantic's validation errors as the one line (or lines) a person reads: ``field: reason`` each.

Every side shows them alike (the producer's refusals, a worker's refused job, the ``-o`` options of
a command): the field's dotted path, pydantic's message without its "Value error, " prefix, no URLs.
Kept free of pydantic at import time, so commands that never validate (``--help``) do not load it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pydantic import ValidationError


def describe_validation_error(err: ValidationError, root: str = "spec", sep: str = "; ") -> str:
    """``field: reason`` for each problem, joined by ``sep``; ``root`` names a problem of the whole
    object (no field: a model validator's)."""
    return sep.join(
        f"{'.'.join(str(p) for p in item['loc']) or root}: {item['msg'].removeprefix('Value error, ')}"
        for item in err.errors(include_url=False)
    )
