"""Finding the program in a model's reply: a pure function."""

from __future__ import annotations

import ast
import re

# A closing fence is ``` at the end of a line (on its own line, or right after the last code line, as
# models sometimes write it); ``` inside the code, in a string like "```json", does not end the block.
_FENCE = re.compile(r"```[ \t]*([A-Za-z0-9_+-]*)[^\n]*\n(.*?)(?:```[ \t]*(?=\n|\Z)|\Z)", re.DOTALL)
_PYTHON_TAGS = {"python", "py", "python3"}


def extract_program(reply: str | None) -> str | None:
    """The program in a reply: the first ```python block, else the only fenced block, else the whole
    reply if it parses as Python. None when there is no program (empty or prose)."""
    if not reply or not reply.strip():
        return None
    blocks = [(m.group(1).lower(), m.group(2)) for m in _FENCE.finditer(reply)]
    for tag, body in blocks:
        if tag in _PYTHON_TAGS and body.strip():
            return body.strip("\n") + "\n"
    if len(blocks) == 1 and blocks[0][1].strip():
        return blocks[0][1].strip("\n") + "\n"
    if blocks:
        return None
    text = reply.strip()
    if _is_python(text):
        return text + "\n"
    return None


def _is_python(text: str) -> bool:
    """Parses as Python and is more than a bare name or sentence fragment."""
    try:
        tree = ast.parse(text)
    except SyntaxError:
        return False
    return any(not isinstance(node, ast.Expr) or isinstance(node.value, ast.Call) for node in tree.body)
