"""Which model a job gets from the EngineServices: whose name it is decides what ``replay:`` may reach,
and a job's choice of names cannot grow the services' state without bound. The real client and
replay server; no sandbox is started (no program runs)."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from pathlib import Path

import pytest

from sandfleet.core.contracts import JobSpec
from sandfleet.core.errors import InvalidSpecError
from sandfleet.core.settings import Settings
from sandfleet.worker.engine.services import MAX_CACHED_MODEL_CLIENTS, EngineOptions, EngineServices
from sandfleet.worker.llm.client import ModelTrust
from sandfleet.worker.tools.registry import ToolRegistry

NOT_IN_FOLDER = "no replay script of that name in this worker's SANDFLEET_REPLAY_SCRIPTS_DIR"


@pytest.fixture
def folders(tmp_path: Path) -> tuple[Path, Path]:
    scripts, outside = tmp_path / "scripts", tmp_path / "outside"
    scripts.mkdir()
    outside.mkdir()
    for folder in (scripts, outside):
        (folder / "answer.json").write_text(json.dumps({"default": [f"from {folder.name}"]}))
    return scripts, outside


def services_for(settings: Settings, trust: ModelTrust = ModelTrust.SUBMITTER) -> Iterator[EngineServices]:
    options = EngineOptions(registry=ToolRegistry([]), pool_size=0, warm=False, job_model_trust=trust)
    services = EngineServices.start(settings, options)
    try:
        yield services
    finally:
        services.close()


def make_settings(scripts: Path, outside: Path) -> Settings:
    return Settings(
        model=f"replay:{outside / 'answer.json'}",  # the operator's own default, outside the folder
        replay_scripts_dir=str(scripts),
        model_api_key=None,
        model_base_url=None,
    )


def reply(services: EngineServices, spec: JobSpec) -> str:
    return services.job_model(spec, "job-1").complete([{"role": "user", "content": "q"}]).text


def test_a_jobs_model_reaches_the_folder_and_the_workers_default_anywhere(folders: tuple[Path, Path]) -> None:
    scripts, outside = folders
    for services in services_for(make_settings(scripts, outside)):
        assert reply(services, JobSpec(question="q")) == "from outside"  # the default: the operator's
        assert reply(services, JobSpec(question="q", model="replay:answer.json")) == "from scripts"
        # the same name as the default, written by a job: the folder rule, whatever is cached
        with pytest.raises(InvalidSpecError, match=NOT_IN_FOLDER):
            services.job_model(JobSpec(question="q", model=services.settings.model), "job-2")


def test_in_ask_and_compare_the_jobs_model_is_the_operators(folders: tuple[Path, Path]) -> None:
    scripts, outside = folders
    settings = make_settings(scripts, outside)
    for services in services_for(settings, ModelTrust.OPERATOR):
        spec = JobSpec(question="q", model=f"replay:{outside / 'answer.json'}")
        assert reply(services, spec) == "from outside"


def test_distinct_model_names_keep_the_client_cache_bounded(folders: tuple[Path, Path]) -> None:
    scripts, outside = folders
    for services in services_for(make_settings(scripts, outside)):
        for i in range(MAX_CACHED_MODEL_CLIENTS + 50):
            services.job_model(JobSpec(question="q", model=f"replay:answer.json?latency=0.{i:04d}"), "job")
        assert len(services._models) == MAX_CACHED_MODEL_CLIENTS


def test_a_broken_default_script_is_not_quoted_to_a_job_on_a_worker(
    folders: tuple[Path, Path], caplog: pytest.LogCaptureFixture
) -> None:
    """The operator's own script, malformed: a job did not choose it, so it does not read it."""
    scripts, outside = folders
    (outside / "broken.yaml").write_text("SECRET-default-4b1e: [unclosed\n")
    settings = make_settings(scripts, outside).model_copy(
        update={"model": f"replay:{outside / 'broken.yaml'}"}
    )
    for services in services_for(settings):
        with (
            caplog.at_level(logging.ERROR, logger="sandfleet.engine"),
            pytest.raises(InvalidSpecError) as caught,
        ):
            services.job_model(JobSpec(question="q"), "job-1")
        assert (
            str(caught.value)
            == "this worker's default model (SANDFLEET_MODEL) is unusable; the worker's log says why"
        )
        assert "SECRET-default-4b1e" in caplog.text  # the operator's log has the parser's words
    for services in services_for(settings, ModelTrust.OPERATOR):  # ask: the user's own file
        with pytest.raises(InvalidSpecError, match="SECRET-default-4b1e"):
            services.job_model(JobSpec(question="q"), "job-1")
