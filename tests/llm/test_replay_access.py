"""A job's ``replay:FILE``: only a regular file inside SANDFLEET_REPLAY_SCRIPTS_DIR, and no word of
what lies outside it. Real files, links and FIFOs on disk; the real client and replay server.

The end-to-end attacks, through a real worker and the ``sandfleet`` CLI, are in
tests/security/test_replay_model.py.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable
from pathlib import Path

import pytest

from sandfleet.core.errors import InvalidSpecError
from sandfleet.core.settings import Settings
from sandfleet.worker.llm.client import make_model_client
from sandfleet.worker.llm.scripted.access import MAX_SCRIPT_BYTES, ModelTrust, read_confined_script

from .helpers import user

MakeSettings = Callable[..., Settings]
NOT_IN_FOLDER = "no replay script of that name in this worker's SANDFLEET_REPLAY_SCRIPTS_DIR"
NOT_VALID = "the file is not a valid replay script (the worker's log says why)"
SECRET = "SECRET-MARKER-7f3a9c"
SCRIPT = {"default": ["from the folder"]}


@pytest.fixture
def folders(tmp_path: Path) -> tuple[Path, Path]:
    """``(scripts, outside)``: the operator's scripts folder, holding ok.json and sub/ok.json, and a
    folder beside it holding secret.yaml (which no job may reach)."""
    scripts, outside = tmp_path / "scripts", tmp_path / "outside"
    (scripts / "sub").mkdir(parents=True)
    outside.mkdir()
    (scripts / "ok.json").write_text(json.dumps(SCRIPT))
    (scripts / "sub" / "ok.json").write_text(json.dumps(SCRIPT))
    (outside / "secret.yaml").write_text(f"{SECRET}: [unclosed\n")
    (outside / "good.json").write_text(json.dumps(SCRIPT))
    return scripts, outside


def refusal(name: str, scripts: Path) -> str:
    with pytest.raises(InvalidSpecError) as caught:
        read_confined_script(name, str(scripts))
    return str(caught.value)


@pytest.mark.parametrize("name", ["ok.json", "sub/ok.json", "./sub//ok.json", "sub/./ok.json"])
def test_a_name_relative_to_the_folder_is_read(name: str, folders: tuple[Path, Path]) -> None:
    scripts, _ = folders
    script = read_confined_script(name, str(scripts))
    assert script.parse().default is not None
    assert script.path == scripts.resolve() / Path(name)


def test_an_absolute_name_inside_the_folder_is_read(folders: tuple[Path, Path]) -> None:
    scripts, _ = folders
    assert read_confined_script(str(scripts / "sub" / "ok.json"), str(scripts)).text == json.dumps(SCRIPT)


def test_the_folder_may_be_named_through_a_link_of_the_operators(
    folders: tuple[Path, Path], tmp_path: Path
) -> None:
    """The setting is the operator's: links in it are followed; only what is below is confined."""
    scripts, _ = folders
    (tmp_path / "scripts-link").symlink_to(scripts)
    setting = str(tmp_path / "scripts-link")
    assert read_confined_script("ok.json", setting).path == scripts.resolve() / "ok.json"
    assert read_confined_script(f"{setting}/ok.json", setting).path == scripts.resolve() / "ok.json"
    assert read_confined_script(f"{scripts}/ok.json", setting).path == scripts.resolve() / "ok.json"


def test_every_name_that_leaves_the_folder_gets_the_same_refusal(
    folders: tuple[Path, Path], tmp_path: Path
) -> None:
    scripts, outside = folders
    (scripts / "link-out.yaml").symlink_to(outside / "secret.yaml")
    (scripts / "link-in.json").symlink_to(scripts / "ok.json")  # links are refused even pointing inside
    (scripts / "dir-link").symlink_to(outside)
    (scripts / "dangling.json").symlink_to(tmp_path / "nothing-here.json")
    names = {
        "/etc/shadow": "an absolute path elsewhere",
        "/etc/no-such-file": "a missing absolute path elsewhere",
        str(outside / "secret.yaml"): "an existing file outside",
        str(outside / "absent.yaml"): "a missing file outside",
        "../outside/secret.yaml": "..",
        "sub/../../outside/secret.yaml": ".. below a folder",
        f"{scripts}/../outside/secret.yaml": ".. after the folder's own path",
        "link-out.yaml": "a link to a file outside",
        "link-in.json": "a link inside",
        "dir-link/secret.yaml": "a link to a folder outside",
        "dangling.json": "a dangling link",
        "absent.json": "a missing file inside",
        "sub": "a folder",
        "": "nothing",
        "ok.json\x00.yaml": "a NUL byte",
    }
    messages = {
        refusal(name, scripts).replace(repr(f"replay:{name}"), "NAME"): why for name, why in names.items()
    }
    assert len(messages) == 1, messages  # one message: nothing tells what exists outside
    (message,) = messages
    assert NOT_IN_FOLDER in message and SECRET not in message and "No such file" not in message


def test_a_fifo_or_a_device_is_refused_without_waiting(folders: tuple[Path, Path]) -> None:
    scripts, _ = folders
    os.mkfifo(scripts / "fifo.json")  # opened for reading without O_NONBLOCK, this would wait forever
    assert NOT_IN_FOLDER in refusal("fifo.json", scripts)


def test_a_link_swapped_in_for_a_checked_folder_is_not_followed(folders: tuple[Path, Path]) -> None:
    """No check-then-open: each component is opened below the last one's descriptor with
    O_NOFOLLOW, so a folder of the path that is (or becomes, at any moment) a link cannot lead out."""
    scripts, outside = folders
    os.rename(scripts / "sub", scripts / "sub-was")
    (scripts / "sub").symlink_to(outside)
    (outside / "ok.json").write_text(json.dumps(SCRIPT))
    assert NOT_IN_FOLDER in refusal("sub/ok.json", scripts)


def test_a_malformed_file_in_the_folder_is_refused_without_quoting_it(
    folders: tuple[Path, Path], caplog: pytest.LogCaptureFixture
) -> None:
    scripts, _ = folders
    cases = {
        "bad.yaml": f"{SECRET}: [unclosed\n",  # the YAML parser quotes the line
        "bad.json": f'{{"{SECRET}": ',  # and the JSON parser the position
        "regex.json": json.dumps({"rules": [{"match": f"{SECRET}(", "responses": ["x"]}]}),  # ours quotes it
        "key.json": json.dumps({SECRET: []}),  # ours names the unknown key
        "latin1.yaml": f"default: ['{SECRET} \xe9']".encode("latin-1"),
        "big.yaml": "#" * MAX_SCRIPT_BYTES + f"\ndefault: ['{SECRET}']",
    }
    for name, content in cases.items():
        target = scripts / name
        target.write_bytes(content if isinstance(content, bytes) else content.encode())
        caplog.clear()
        with (
            caplog.at_level(logging.WARNING, logger="sandfleet.llm.replay"),
            pytest.raises(InvalidSpecError) as caught,
        ):
            read_confined_script(name, str(scripts)).parse()
        assert NOT_VALID in str(caught.value) and SECRET not in str(caught.value), name
        assert str(scripts / name) in caplog.text, name  # the operator's log says which file and why


def test_the_refusal_carries_no_chained_parser_error(folders: tuple[Path, Path]) -> None:
    """``from None``: a traceback of the refusal (in a log a submitter might see) holds no parser text."""
    scripts, _ = folders
    (scripts / "bad.yaml").write_text(f"{SECRET}: [unclosed\n")
    with pytest.raises(InvalidSpecError) as caught:
        read_confined_script("bad.yaml", str(scripts)).parse()
    assert caught.value.__cause__ is None and caught.value.__suppress_context__


def test_an_unset_folder_refuses_every_jobs_replay_model_and_names_the_setting(
    folders: tuple[Path, Path], make_settings: MakeSettings
) -> None:
    scripts, _ = folders
    for name in ("ok.json", str(scripts / "ok.json")):
        with pytest.raises(InvalidSpecError, match="SANDFLEET_REPLAY_SCRIPTS_DIR is not set"):
            make_model_client(f"replay:{name}", make_settings(replay_scripts_dir=None))


def test_a_jobs_model_inside_the_folder_answers_and_the_operators_anywhere(
    folders: tuple[Path, Path], make_settings: MakeSettings
) -> None:
    scripts, outside = folders
    settings = make_settings(replay_scripts_dir=str(scripts))
    job = make_model_client("replay:ok.json?latency=0.01", settings, trust=ModelTrust.SUBMITTER)
    assert job.complete([user("q")]).text == "from the folder"
    with pytest.raises(InvalidSpecError, match=NOT_IN_FOLDER):
        make_model_client(f"replay:{outside / 'good.json'}", settings, trust=ModelTrust.SUBMITTER)
    operator = make_model_client(f"replay:{outside / 'good.json'}", settings, trust=ModelTrust.OPERATOR)
    assert operator.complete([user("q")]).text == "from the folder"


def test_a_server_the_operator_started_is_not_a_way_in_for_a_job(
    folders: tuple[Path, Path], make_settings: MakeSettings
) -> None:
    """The check runs on every lookup, before a started server is reused."""
    scripts, outside = folders
    settings = make_settings(replay_scripts_dir=str(scripts))
    make_model_client(f"replay:{outside / 'good.json'}", settings, trust=ModelTrust.OPERATOR)
    with pytest.raises(InvalidSpecError, match=NOT_IN_FOLDER):
        make_model_client(f"replay:{outside / 'good.json'}", settings, trust=ModelTrust.SUBMITTER)
