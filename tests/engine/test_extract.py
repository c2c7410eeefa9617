"""Finding the program in a model reply: a pure function, no fakes."""

from __future__ import annotations

import pytest

from sandfleet.worker.engine.extract import extract_program


def test_the_first_python_block_is_the_program() -> None:
    reply = "Let me compute it.\n\n```python\nprint('RESULT: 1')\n```\n\nThat prints the answer."
    assert extract_program(reply) == "print('RESULT: 1')\n"


@pytest.mark.parametrize("tag", ["python", "py", "python3", "Python"])
def test_python_tags_are_recognised(tag: str) -> None:
    assert extract_program(f"```{tag}\nx = 1\n```") == "x = 1\n"


def test_of_two_python_blocks_the_first_wins() -> None:
    reply = "```python\nprint('RESULT: first')\n```\nor else\n```python\nprint('RESULT: second')\n```"
    assert extract_program(reply) == "print('RESULT: first')\n"


def test_a_python_block_wins_over_an_earlier_block_of_another_tag() -> None:
    reply = "Input:\n```json\n{\"a\": 1}\n```\nProgram:\n```python\nprint('RESULT: 2')\n```"
    assert extract_program(reply) == "print('RESULT: 2')\n"


def test_the_only_fenced_block_counts_whatever_its_tag() -> None:
    assert extract_program("Here:\n```\nprint('RESULT: 3')\n```") == "print('RESULT: 3')\n"
    assert extract_program("Here:\n```text\nprint('RESULT: 4')\n```") == "print('RESULT: 4')\n"


def test_two_blocks_of_other_tags_give_no_program() -> None:
    assert extract_program("```text\nprint(1)\n```\n```sh\necho 2\n```") is None


def test_a_whole_reply_that_parses_as_python_is_the_program() -> None:
    reply = "import json\nprint('RESULT: ' + json.dumps([1, 2]))"
    assert extract_program(reply) == reply + "\n"


@pytest.mark.parametrize(
    "reply",
    [
        "I cannot answer that without more data.",
        "Sorry",  # a bare name parses as Python but is not a program
        "The answer is 42.",
    ],
)
def test_prose_gives_no_program(reply: str) -> None:
    assert extract_program(reply) is None


@pytest.mark.parametrize("reply", ["", "   \n\t", None, "```python\n\n```"])
def test_an_empty_reply_or_block_gives_no_program(reply: str | None) -> None:
    assert extract_program(reply) is None


def test_an_unclosed_python_block_runs_to_the_end_of_the_reply() -> None:
    assert extract_program("```python\nx = 1\nprint('RESULT:', x)\n") == "x = 1\nprint('RESULT:', x)\n"


def test_indentation_inside_the_block_is_kept() -> None:
    reply = "```python\nfor i in range(2):\n    print(i)\n```"
    assert extract_program(reply) == "for i in range(2):\n    print(i)\n"


def test_a_fence_inside_a_string_of_the_program_does_not_end_the_block() -> None:
    program = 'report = "```json\\n{}\\n```"\nprint("RESULT: " + repr("```"))\n'
    assert extract_program(f"Here:\n```python\n{program}```\nDone.") == program


def test_a_closing_fence_right_after_the_last_code_line_ends_the_block() -> None:
    assert extract_program("```python\nprint('RESULT: 1')```\nThat is all.") == "print('RESULT: 1')\n"
