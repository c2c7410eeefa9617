"""What a model is shown of long text: the head and the tail, and how much was left out. Pure.

Used for shell commands' output and for tool results in the tool-calling loop. For a command's output,
the agent keeps the first ``head + tail`` bytes of each stream and, separately, its last ``tail``
bytes. Output that fits in ``head + tail`` is shown whole; longer output shows its first ``head``
bytes, a marker naming the sizes, and its last ``tail`` bytes, so the error at the end of a long
build log is never cut away.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ShownStream:
    """One output stream as shown: ``text``, the stream's real size in bytes, and whether bytes were left out."""

    text: str
    total_bytes: int
    truncated: bool


def split_budget(max_bytes: int) -> tuple[int, int]:
    """``(head, tail)`` bytes of a stream's budget: half each (the head gets the odd byte)."""
    tail = max_bytes // 2
    return max_bytes - tail, tail


def shown_stream(kept: str, end: str, total_bytes: int, max_bytes: int) -> ShownStream:
    """A stream cut to ``max_bytes``: whole when it fits, else head, marker, tail.

    Args:
        kept: the first ``max_bytes`` of the stream (as the agent kept them), decoded.
        end: its last ``max_bytes // 2`` bytes, decoded.
        total_bytes: how many bytes the command wrote to the stream.
        max_bytes: the budget of what is shown, head and tail together.
    """
    if total_bytes <= max_bytes:
        return ShownStream(kept, total_bytes, False)
    head_bytes, tail_bytes = split_budget(max_bytes)
    head = kept.encode(errors="surrogateescape")[:head_bytes].decode(errors="ignore")
    tail = end.encode(errors="surrogateescape")[-tail_bytes:].decode(errors="ignore") if tail_bytes else ""
    omitted = total_bytes - head_bytes - tail_bytes
    marker = (
        f"\n[... {omitted:,} bytes left out: the stream was {total_bytes:,} bytes; "
        f"its first {head_bytes:,} and last {tail_bytes:,} are shown ...]\n"
    )
    return ShownStream(head + marker + tail, total_bytes, True)


def clip_text(text: str, max_bytes: int) -> tuple[str, int]:
    """``(shown, size)``: a text cut to its head and tail when its UTF-8 form is over ``max_bytes``."""
    data = text.encode(errors="surrogatepass")
    if len(data) <= max_bytes:
        return text, len(data)
    head_bytes, tail_bytes = split_budget(max_bytes)
    return (
        shown_stream(
            data[: head_bytes + tail_bytes].decode(errors="ignore"),
            data[-tail_bytes:].decode(errors="ignore") if tail_bytes else "",
            len(data),
            max_bytes,
        ).text,
        len(data),
    )
