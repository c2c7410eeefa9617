"""The messages sent to the model: the system prompts (code-action, tool loop), the conversation, repairs.

The texts live as package data (``prompts/*.txt``) so they can be read and changed without code.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from importlib import resources

from sandfleet.core.contracts import Turn

STDERR_TAIL_CHARS = 2000
STDOUT_TAIL_CHARS = 1000


# What the data-science image (deploy/images/sandbox-ds) adds to the standard library.
DATA_SCIENCE_LIBRARIES = "the standard library, numpy, pandas and matplotlib"


@cache
def template(name: str) -> str:
    return resources.files("sandfleet.worker.engine").joinpath("prompts", f"{name}.txt").read_text()


def system_message(tools_description: str, *, max_tool_calls: int, data_science: bool) -> str:
    libraries = DATA_SCIENCE_LIBRARIES if data_science else "the standard library only"
    tools = tools_description.strip() or template("no_tools").strip()
    return template("system").format(libraries=libraries, max_tool_calls=max_tool_calls, tools=tools)


def first_messages(question: str, history: list[Turn], system: str) -> list[dict[str, str]]:
    """System prompt, the earlier turns of the conversation, then the question."""
    messages = [{"role": "system", "content": system}]
    messages += [{"role": turn.role, "content": turn.content} for turn in history]
    messages.append({"role": "user", "content": question})
    return messages


@dataclass(frozen=True)
class AttemptFailure:
    """What went wrong in one code-action attempt, as the repair request tells the model: why it does
    not count (``failure``), and of a program that ran its exit code, output, and whether it was
    killed at its time limit or hit the tool-call budget (a reply without a program has none of these).
    """

    failure: str
    exit_code: int | None = None
    stderr: str = ""
    stdout: str = ""
    timed_out: bool = False
    tool_cap_hit: bool = False


def repair_message(failed: AttemptFailure) -> dict[str, str]:
    """The user turn that asks for a corrected program, with what went wrong."""
    details = []
    if failed.exit_code is not None and not failed.timed_out:
        details.append(f"Exit code: {failed.exit_code}.")
    if failed.timed_out:
        details.append("It was killed at its time limit: make it faster or avoid endless loops.")
    if failed.tool_cap_hit:
        details.append("It hit the tool-call budget: call tools fewer times (fetch data once, then compute).")
    if failed.stderr.strip():
        details.append(f"The end of its stderr:\n```\n{failed.stderr[-STDERR_TAIL_CHARS:]}\n```")
    if failed.stdout.strip():
        details.append(f"The end of its stdout:\n```\n{failed.stdout[-STDOUT_TAIL_CHARS:]}\n```")
    text = template("repair").format(failure=failed.failure, details="\n".join(details))
    return {"role": "user", "content": text}


def tool_loop_system(
    *, shell: bool, max_tool_calls: int, data_science: bool = False, network: str = "none"
) -> str:
    """The system prompt of a shell or chat job (prompts/tool_loop.txt with shell.txt or chat.txt)."""
    if shell:
        libraries = DATA_SCIENCE_LIBRARIES if data_science else "the standard library"
        access = "no network" if network == "none" else f"network access ({network})"
        mode = template("shell").format(libraries=libraries, network=access).strip()
    else:
        mode = template("chat").strip()
    return template("tool_loop").format(max_tool_calls=max_tool_calls, mode=mode)
