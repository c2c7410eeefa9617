"""Custom images end to end: ``sandfleet images build --name NAME --pip PKG`` on this engine, with the
package from the index, then a real worker whose policy allows custom images runs a job importing it.

A package the index does not know fails the build with pip's own message, and no image is tagged.
Every image made here has a fresh name and is removed afterwards.
"""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from sandfleet.core.contracts import JobStatus
from sandfleet.worker.images.build import LABEL_RECIPE, inspect_image
from sandfleet.worker.images.custom import LABEL_CUSTOM, LABEL_PACKAGES, custom_tag

from .helpers import JOB_TIMEOUT_S, WorkerFactory

SANDFLEET = str(Path(sys.executable).with_name("sandfleet"))
BUILD_TIMEOUT_S = 600
IMPORT_SIX = '```python\nimport json, six\nprint("RESULT: " + json.dumps({"six": six.__version__, "file": six.__file__}))\n```'


def build(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [SANDFLEET, "images", "build", *args], capture_output=True, text=True, timeout=BUILD_TIMEOUT_S
    )


def labels(tag: str) -> dict[str, str]:
    out = subprocess.run(
        ["docker", "image", "inspect", tag, "--format", "{{json .Config.Labels}}"],
        capture_output=True,
        text=True,
    )
    return json.loads(out.stdout) if out.returncode == 0 else {}


@pytest.fixture(scope="module")
def six_image(docker_engine: object) -> Iterator[str]:
    name = f"t{uuid.uuid4().hex[:8]}-six"
    tag = custom_tag(name)
    try:
        first = build("--name", name, "--pip", "six")
        assert first.returncode == 0, first.stderr + first.stdout
        assert "built" in first.stdout.split(tag, 1)[1].splitlines()[0]
        yield name
    finally:
        subprocess.run(["docker", "image", "rm", "-f", tag], capture_output=True)


def test_the_image_is_labelled_and_an_unchanged_recipe_is_skipped(six_image: str) -> None:
    tag = custom_tag(six_image)
    found = labels(tag)
    assert found[LABEL_CUSTOM] == six_image and found[LABEL_PACKAGES] == "pip: six"
    assert len(found[LABEL_RECIPE]) == 64
    again = build("--name", six_image, "--pip", "six", "--json")
    assert again.returncode == 0, again.stderr
    assert json.loads(again.stdout)[-1] == {**json.loads(again.stdout)[-1], "tag": tag, "status": "skipped"}


def test_the_image_keeps_the_sandbox_user_and_has_the_package_without_pip(six_image: str) -> None:
    tag = custom_tag(six_image)
    code = (
        "import os, six, importlib.util as u; print(os.getuid(), six.__version__, u.find_spec('pip') is None)"
    )
    out = subprocess.run(
        ["docker", "run", "--rm", "--network", "none", "--read-only", "--user", "10001:10001", "--cap-drop", "ALL",
         tag, "python3", "-s", "-c", code],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    uid, version, no_pip = out.stdout.split()
    assert out.returncode == 0 and uid == "10001" and version.startswith("1.") and no_pip == "True"
    passwd = subprocess.run(
        ["docker", "run", "--rm", tag, "getent", "passwd", "sandbox"], capture_output=True, text=True
    )
    assert passwd.stdout.startswith("sandbox:x:10001:10001:")


def test_a_job_imports_the_package_in_the_custom_image(six_image: str, fleet_worker: WorkerFactory) -> None:
    worker = fleet_worker(
        "worker", env={"SANDFLEET_POLICY_IMAGES": "sandfleet/sandbox:py3.11,sandfleet/custom-*:py3.11"}
    )
    script = worker.scripts_dir / "script.json"
    script.write_text(json.dumps({"default": [IMPORT_SIX]}))
    tag = custom_tag(six_image)
    job = worker.client.submit("Which six is installed?", model=f"replay:{script}", sandbox={"image": tag})
    result = job.result(timeout=JOB_TIMEOUT_S)
    assert result.status == JobStatus.SUCCEEDED, result.error
    assert result.result["file"] == "/usr/local/lib/python3.11/dist-packages/six.py"
    # the same job in the plain sandbox image fails: the package is the custom image's
    plain = worker.client.submit("Which six is installed?", model=f"replay:{script}").result(
        timeout=JOB_TIMEOUT_S
    )
    assert plain.status == JobStatus.FAILED and "No module named 'six'" in plain.attempts[-1].stderr_tail
    # an image the policy does not allow is refused before anything runs
    refused = worker.client.submit(
        "Which six?", model=f"replay:{script}", sandbox={"image": "sandfleet/other:py3.11"}
    )
    assert refused.result(timeout=JOB_TIMEOUT_S).status == JobStatus.REFUSED


def test_a_package_the_index_does_not_know_fails_with_pips_message_and_tags_nothing(
    docker_engine: object,
) -> None:
    name = f"t{uuid.uuid4().hex[:8]}-bad"
    missing = f"no-such-package-sandfleet-{uuid.uuid4().hex[:8]}"
    failed = build("--name", name, "--pip", "six", "--pip", missing)
    assert failed.returncode == 1
    assert f"ERROR: No matching distribution found for {missing}" in failed.stderr
    assert inspect_image(custom_tag(name)) is None


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--pip", "--index-url=http://evil.example/simple"], "options, URLs and paths are not accepted"),
        (["--pip", "six; rm -rf /"], "options, URLs and paths are not accepted"),
        (["--apt", "libfoo bar"], "give Debian package names"),
        ([], "needs at least one --pip or --apt package"),
    ],
)
def test_what_cannot_be_a_package_is_refused_before_any_build(
    docker_engine: object, args: list[str], message: str
) -> None:
    name = f"t{uuid.uuid4().hex[:8]}-refused"
    out = build("--name", name, *args)
    assert out.returncode == 1 and message in out.stderr
    assert inspect_image(custom_tag(name)) is None
