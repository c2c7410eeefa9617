"""The messages sent to the model: system prompt, conversation, repair requests. Pure, no fakes."""

from __future__ import annotations

from importlib import resources
from pathlib import Path

import pytest

import sandfleet.worker.engine.prompt as prompt_module
from sandfleet.core.contracts import Turn
from sandfleet.worker.engine.prompt import (
    AttemptFailure,
    first_messages,
    repair_message,
    system_message,
    template,
)
from sandfleet.worker.tools.registry import ToolRegistry


def monthly_sales(region: str, month: int = 7) -> list[dict]:
    """Sales of one region in one month (1-12), one dict per order.

    This second line is detail the model does not need.
    """
    return []


def notify(to: str) -> None:
    """Tell someone that the report is ready."""


@pytest.fixture(scope="module")
def tools_text() -> str:
    return ToolRegistry.from_functions([monthly_sales, notify]).describe()


def test_system_prompt_lists_signatures_and_first_docstring_lines(tools_text: str) -> None:
    text = system_message(tools_text, max_tool_calls=7, data_science=False)
    assert "monthly_sales(region: str, month: int = 7) -> list[dict]" in text
    assert "Sales of one region in one month (1-12), one dict per order." in text
    assert "notify(to: str) -> None" in text and "Tell someone that the report is ready." in text
    assert "second line is detail" not in text
    assert "At most 7 tool calls" in text
    assert "from sandfleet_tools import *" in text


def test_system_prompt_states_the_rules(tools_text: str) -> None:
    text = system_message(tools_text, max_tool_calls=50, data_science=False)
    assert "ONE Python program" in text
    assert "RESULT: <answer>" in text and "last line" in text
    assert "exactly one ```python fenced code block" in text
    assert "no input()" in text and "no network" in text.lower()
    assert "the standard library only" in text
    assert "numpy" not in text
    assert "plain Python values" in text
    assert "do the work in Python" in text


def test_data_science_image_allows_numpy_and_pandas(tools_text: str) -> None:
    text = system_message(tools_text, max_tool_calls=50, data_science=True)
    assert "the standard library, numpy, pandas and matplotlib" in text
    assert "standard library only" not in text


def test_a_job_without_tools_is_told_so() -> None:
    text = system_message("", max_tool_calls=50, data_science=False)
    assert "this job has no tools" in text


def test_history_turns_come_between_system_and_question_in_order() -> None:
    history = [
        Turn(role="user", content="my codeword is PELICAN"),
        Turn(role="assistant", content="noted"),
        Turn(role="user", content="and the region is EMEA"),
        Turn(role="assistant", content="noted too"),
    ]
    messages = first_messages("What is my codeword?", history, "SYSTEM")
    assert messages == [
        {"role": "system", "content": "SYSTEM"},
        {"role": "user", "content": "my codeword is PELICAN"},
        {"role": "assistant", "content": "noted"},
        {"role": "user", "content": "and the region is EMEA"},
        {"role": "assistant", "content": "noted too"},
        {"role": "user", "content": "What is my codeword?"},
    ]


def test_repair_message_names_exit_code_and_the_tail_of_stderr() -> None:
    stderr = "x" * 5000 + "\nKeyError: 'revenue'"
    message = repair_message(
        AttemptFailure(
            "the program exited with code 1",
            exit_code=1,
            stderr=stderr,
            stdout="partial output",
            timed_out=False,
            tool_cap_hit=False,
        )
    )
    assert message["role"] == "user"
    text = message["content"]
    assert "the program exited with code 1" in text
    assert "Exit code: 1." in text
    assert "KeyError: 'revenue'" in text
    assert stderr[-prompt_module.STDERR_TAIL_CHARS :] in text
    assert stderr[-prompt_module.STDERR_TAIL_CHARS - 1 :] not in text  # only the tail
    assert "partial output" in text
    assert "corrected version of the whole program" in text and "```python" in text
    assert "time limit" not in text and "tool-call budget" not in text


def test_repair_message_says_when_the_program_timed_out() -> None:
    text = repair_message(
        AttemptFailure(
            "the program timed out (killed at 2 s)",
            exit_code=137,
            stderr="",
            stdout="",
            timed_out=True,
            tool_cap_hit=False,
        )
    )["content"]
    assert "killed at its time limit" in text and "endless loops" in text
    assert "Exit code" not in text  # the kill's exit code would only mislead


def test_repair_message_says_when_the_tool_budget_was_hit() -> None:
    text = repair_message(
        AttemptFailure(
            "the program exceeded its tool-call budget and exited with code 1",
            exit_code=1,
            stderr="ToolBudgetExceeded: tool-call budget of 3 exceeded",
            stdout="",
            timed_out=False,
            tool_cap_hit=True,
        )
    )["content"]
    assert "It hit the tool-call budget: call tools fewer times" in text


def test_repair_message_for_a_reply_without_code_has_no_run_details() -> None:
    text = repair_message(AttemptFailure("the reply contained no Python program"))["content"]
    assert "the reply contained no Python program" in text
    assert "Exit code" not in text and "stderr" not in text


@pytest.mark.parametrize("name", ["system", "repair", "no_tools"])
def test_prompt_texts_are_package_data(name: str) -> None:
    resource = resources.files("sandfleet.worker.engine").joinpath("prompts", f"{name}.txt")
    assert resource.is_file()
    assert template(name) == resource.read_text()


def test_prompt_wording_lives_in_the_text_files_not_in_code() -> None:
    source = Path(prompt_module.__file__).read_text()
    assert "You answer questions by writing ONE Python program" in template("system")
    assert "You answer questions by writing ONE Python program" not in source


def test_packaging_ships_the_prompt_files() -> None:
    import tomllib

    pyproject = Path(__file__).resolve().parents[2] / "pyproject.toml"
    package_data = tomllib.loads(pyproject.read_text())["tool"]["setuptools"]["package-data"]
    assert "engine/prompts/*.txt" in package_data["sandfleet.worker"]
