"""The generated references match what the code says now: change a setting or a command's help and
regenerate them with ``.venv/bin/python deploy/gen_docs.py``."""

from __future__ import annotations

from pathlib import Path

import pytest

from sandfleet import cli_doc
from sandfleet.core import settings_doc
from sandfleet.core.settings import Settings

DOCS = Path(__file__).resolve().parents[2] / "docs"


@pytest.mark.parametrize(
    ("name", "render"), [("settings.md", settings_doc.render), ("cli.md", cli_doc.render)]
)
def test_the_committed_reference_is_the_generated_one(name: str, render: object) -> None:
    assert callable(render)
    assert (DOCS / name).read_text() == render(), (
        f"docs/{name} drifted: run .venv/bin/python deploy/gen_docs.py"
    )


def test_every_setting_has_a_row_and_a_description() -> None:
    text = settings_doc.render()
    for name, field in Settings.model_fields.items():
        assert f"| `{name}` |" in text
        assert field.description, f"Settings.{name} has no description: docs/settings.md would say nothing"


def test_every_command_has_a_section() -> None:
    from sandfleet.cli import COMMANDS

    text = cli_doc.render()
    for name in COMMANDS:
        assert f"`sandfleet {name}`" in text


def test_a_changed_description_is_seen_as_drift() -> None:
    field = Settings.model_fields["redis_url"]
    before = settings_doc.render()
    original = field.description
    try:
        field.description = "something else"
        assert settings_doc.render() != before
    finally:
        field.description = original
