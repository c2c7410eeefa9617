"""``sandfleet ask`` as a real process: the reference scenario end to end, and a missing model key."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sandfleet.core.contracts import JobResult, JobStatus
from sandfleet.worker.tools.examples.scenario import REFERENCE_ANSWER, REFERENCE_PROGRAM, REFERENCE_QUESTION

from .helpers import clean_env, python_block, sandfleet_ask

REFERENCE_STDOUT = '{"North America": 108664.0, "LATAM": 81328.0, "EMEA": 77689.0, "APAC": 65023.0}\n'


@pytest.fixture
def reference_script(tmp_path: Path) -> Path:
    script = {"rules": [{"match": "revenue per region", "responses": [python_block(REFERENCE_PROGRAM)]}]}
    path = tmp_path / "reference.json"
    path.write_text(json.dumps(script))
    return path


def test_the_reference_scenario_prints_the_four_totals(
    docker_engine: object, orders_dir: Path, reference_script: Path
) -> None:
    env = clean_env(SANDFLEET_DATA_DIR=str(orders_dir))
    args = (
        REFERENCE_QUESTION,
        "--tools",
        "sandfleet.worker.tools.examples.orders",
        "--model",
        f"replay:{reference_script}",
    )
    done, created = sandfleet_ask(*args, "--show-program", env=env, verbose=True)

    assert done.returncode == 0, done.stderr
    assert done.stdout == REFERENCE_STDOUT  # logging goes to stderr only
    assert json.loads(done.stdout) == REFERENCE_ANSWER
    assert f"--- program ---\n{REFERENCE_PROGRAM}--- end ---" in done.stderr  # --show-program
    # -vv: the engine's debug log lets the user watch what the model wrote and what it did.
    assert f"sandfleet.engine: attempt 1 program:\n{REFERENCE_PROGRAM}" in done.stderr
    assert "sandfleet.engine: attempt 1 exit 0" in done.stderr
    assert len(created) == 1  # one fresh container for the one attempt (and the count works)

    done, _ = sandfleet_ask(*args, "--json", env=env)
    assert done.returncode == 0, done.stderr
    result = JobResult.model_validate_json(done.stdout)
    assert result.status == JobStatus.SUCCEEDED
    assert result.result == REFERENCE_ANSWER and result.repairs == 0
    assert result.attempts[0].result_text == REFERENCE_STDOUT.strip()
    assert result.model == f"replay:{reference_script}"
    assert result.tool_calls == 1 and result.attempts[0].tool_calls[0].tool == "load_orders"


def test_no_key_and_no_base_url_is_refused_before_any_sandbox_starts(
    docker_engine: object, orders_dir: Path
) -> None:
    env = clean_env(SANDFLEET_DATA_DIR=str(orders_dir))
    done, created = sandfleet_ask(
        REFERENCE_QUESTION,
        "--tools",
        "sandfleet.worker.tools.examples.orders",
        "--model",
        "openai:gpt-5-mini",
        env=env,
    )

    assert done.returncode != 0
    assert "OPENAI_API_KEY" in done.stderr and "OPENAI_BASE_URL" in done.stderr
    assert "Traceback" not in done.stderr
    assert done.stdout == ""
    assert created == []


ARTIFACT_PROGRAM = """import os
os.makedirs("/workspace/out/tables", exist_ok=True)
with open("/workspace/out/report.csv", "w") as f:
    f.write("region,total\\nEMEA,1\\n")
with open("/workspace/out/tables/blob.bin", "wb") as f:
    f.write(bytes(range(256)) * 4096)
os.symlink("/etc/passwd", "/workspace/out/passwd")
print("RESULT: 2")
"""


def test_ask_out_writes_the_jobs_artifacts(docker_engine: object, tmp_path: Path) -> None:
    """``sandfleet ask --out DIR``: the files the program left in /workspace/out/ land under DIR with
    the bytes it wrote and the digests its result lists; a symlink there is skipped, and said so."""
    import hashlib

    script = tmp_path / "artifacts.json"
    script.write_text(
        json.dumps({"rules": [{"match": "files", "responses": [python_block(ARTIFACT_PROGRAM)]}]})
    )
    out = tmp_path / "out"
    args = ("Write the files", "--tools", "", "--model", f"replay:{script}", "--out", str(out))
    done, created = sandfleet_ask(*args, "--json", env=clean_env())

    assert done.returncode == 0, done.stderr
    result = JobResult.model_validate_json(done.stdout)
    assert result.status == JobStatus.SUCCEEDED and len(created) == 1
    blob = bytes(range(256)) * 4096
    written = {str(p.relative_to(out)): p.read_bytes() for p in out.rglob("*") if p.is_file()}
    assert written == {"report.csv": b"region,total\nEMEA,1\n", "tables/blob.bin": blob}
    assert {a.name: a.sha256 for a in result.artifacts} == {
        name: hashlib.sha256(data).hexdigest() for name, data in written.items()
    }
    assert "artifact skipped: passwd: a symbolic link (never followed)" in done.stderr
    assert f"2 artifact file(s) written to {out}" in done.stderr
