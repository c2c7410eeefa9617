"""Artifacts, the pure parts: the host's reading of a (possibly forged) collection, names, caps, the
custom-image request, and the verifier's artifact checks. No Docker, no Redis."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sandfleet.core.artifacts import (
    FileArtifactStore,
    MemoryArtifactStore,
    name_problem,
    safe_destination,
    sha256_bytes,
)
from sandfleet.core.contracts import ArtifactLimits
from sandfleet.core.errors import ArtifactIntegrityError, InvalidSpecError, PolicyViolationError
from sandfleet.core.settings import Settings
from sandfleet.core.signing import KeyRing
from sandfleet.core.verify import JobEvidence, _Check
from sandfleet.producer.artifacts import checked_bytes, write_artifacts
from sandfleet.worker.images.custom import check_request, pip_target_command
from sandfleet.worker.program.artifacts import ArtifactCaps, parse_collection

CAPS = ArtifactCaps(max_file_bytes=100, max_total_bytes=150, max_files=3)


def answer(files: list[tuple[str, bytes]], skipped: list[dict[str, object]] | None = None, **lie: object):
    listing = {"files": [{"name": n, "size": len(d)} for n, d in files], "skipped": skipped or []}
    listing.update(lie)
    text = json.dumps(listing).encode()
    return {"ok": True, "listing_len": len(text)}, text + b"".join(d for _, d in files)


def test_files_are_hashed_by_the_host_and_typed_by_name() -> None:
    header, body = answer([("plot.png", b"\x89PNG..."), ("t/data.csv", b"a,b\n")])
    got = parse_collection(header, body, CAPS)
    assert [(a.info.name, a.info.media_type) for a in got.kept] == [
        ("plot.png", "image/png"),
        ("t/data.csv", "text/csv"),
    ]
    assert got.kept[0].info.sha256 == sha256_bytes(b"\x89PNG...") and not got.cap_hit


def test_a_listing_whose_sizes_disagree_with_its_bytes_keeps_nothing() -> None:
    header, body = answer([("a.txt", b"12345")])
    got = parse_collection(header, body + b"smuggled", CAPS)
    assert not got.kept and "other bytes than its listing" in got.skipped[0].reason
    assert not parse_collection({"listing_len": 10**9}, body, CAPS).kept
    assert not parse_collection({"listing_len": 3}, b"{x}", CAPS).kept


@pytest.mark.parametrize(
    "name", ["../escape", "/etc/passwd", "a//b", "./a", "a/../../b", "new\nline", "back\\slash", ""]
)
def test_names_that_are_not_plain_relative_paths_are_skipped(name: str) -> None:
    header, body = answer([(name, b"x"), ("ok.txt", b"y")])
    got = parse_collection(header, body, CAPS)
    assert [a.info.name for a in got.kept] == ["ok.txt"] and got.skipped[0].size == 1


def test_the_host_enforces_the_caps_whatever_the_agent_says() -> None:
    header, body = answer(
        [
            ("big", b"x" * 101),
            ("a", b"a" * 90),
            ("b", b"b" * 90),
            ("a", b"dup"),
            ("c", b"c"),
            ("d", b"d"),
            ("e", b"e"),
        ]
    )
    got = parse_collection(header, body, CAPS)
    assert [a.info.name for a in got.kept] == ["a", "c", "d"] and got.cap_hit
    reasons = {s.name + str(s.size): s.reason for s in got.skipped}
    assert reasons["big101"].startswith("larger than the cap of 100")
    assert reasons["b90"].startswith("past the cap of 150 bytes")
    assert reasons["a3"] == "listed twice" and reasons["e1"].startswith("past the cap of 3 files")


def test_a_job_may_lower_the_operators_caps_but_not_raise_them() -> None:
    settings = Settings(artifact_max_file_bytes="1M", artifact_max_files=10)
    caps = ArtifactCaps.for_job(settings, ArtifactLimits(max_file_bytes=1000))
    assert (caps.max_file_bytes, caps.max_files) == (1000, 10)
    with pytest.raises(PolicyViolationError, match="SANDFLEET_ARTIFACT_MAX_FILES"):
        ArtifactCaps.for_job(settings, ArtifactLimits(max_files=11))
    assert not ArtifactCaps.for_job(settings, ArtifactLimits(max_files=0)).enabled


def test_writing_never_leaves_the_folder(tmp_path: Path) -> None:
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "link").symlink_to(tmp_path)
    with pytest.raises(ValueError, match="outside"):
        safe_destination(tmp_path / "out", "link/x.txt")
    with pytest.raises(ValueError, match="not a plain relative path"):
        safe_destination(tmp_path / "out", "../x.txt")
    assert name_problem("a/b/c.png") is None and name_problem("\udce9.txt") == "the name is not valid UTF-8"


def test_fetched_bytes_are_checked_and_nothing_is_written_when_one_file_changed(tmp_path: Path) -> None:
    from sandfleet.core.contracts import ArtifactInfo, JobResult, JobStatus

    store = FileArtifactStore(tmp_path / "store")
    good, bad = b"good bytes", b"original"
    infos = [
        ArtifactInfo(name="good.txt", size=len(good), media_type="text/plain", sha256=sha256_bytes(good)),
        ArtifactInfo(name="bad.txt", size=len(bad), media_type="text/plain", sha256=sha256_bytes(bad)),
    ]
    store.put("job-1", infos[0].sha256, good)
    store.put("job-1", infos[1].sha256, b"tampered")
    result = JobResult(job_id="job-1", status=JobStatus.SUCCEEDED, artifacts=infos)
    assert checked_bytes(store, "job-1", infos[0]) == good
    with pytest.raises(ArtifactIntegrityError, match="not the ones the chain commits to"):
        write_artifacts(store, result, tmp_path / "out")
    assert not (tmp_path / "out" / "good.txt").exists()
    with pytest.raises(ArtifactIntegrityError, match="missing"):
        checked_bytes(MemoryArtifactStore(), "job-1", infos[0])


def test_the_verifier_names_a_changed_or_missing_artifact() -> None:
    listed = [{"name": "p.png", "sha256": "a" * 64, "size": 1, "media_type": "image/png"}]
    record = {"status": "succeeded", "result": json.dumps({"artifacts": listed})}
    check = _Check(JobEvidence("j", record, [], artifact_digests={"a" * 64: "b" * 64}), KeyRing([], "test"))
    check.check_artifacts(check.artifact_digests)
    assert any("not the ones the audit chain recorded" in p for p in check.problems)  # no artifacts event
    assert any("artifact 'p.png': its stored bytes are not the ones" in p for p in check.problems)
    check = _Check(JobEvidence("j", record, [], artifact_digests={}), KeyRing([], "test"))
    check.check_artifacts({})
    assert any("stored bytes are missing" in p for p in check.problems)


def test_an_unfinished_job_whose_last_delivery_recorded_artifacts_still_holds() -> None:
    """A delivery that stored artifacts (their event) and died before its final write: the job runs
    again, and a worker verifying its chain before resuming it must not take that for tampering."""
    from sandfleet.core.contracts import AuditEvent, AuditKind

    files = [{"name": "p.png", "sha256": "a" * 64}]
    event = AuditEvent(ts=0.0, job_id="j", kind=AuditKind.ARTIFACTS, data={"files": files})
    check = _Check(JobEvidence("j", {"status": "running"}, []), KeyRing([], "test"))
    check.events = [event]
    check.check_artifacts(None)
    assert check.problems == []
    check = _Check(JobEvidence("j", {"status": "succeeded", "result": "{}"}, []), KeyRing([], "test"))
    check.events = [event]
    check.check_artifacts(None)  # a final record must list what the chain recorded
    assert check.problems == ["the record's artifacts are not the ones the audit chain recorded"]


def test_custom_image_requests_are_checked_before_anything_runs() -> None:
    assert check_request("geo", ["six", "shapely==2.0.6", "six"], []) == (["shapely==2.0.6", "six"], [])
    for bad in (["--index-url=http://x"], ["six; rm -rf /"], ["git+https://x/y"], ["./local"], ["a b"]):
        with pytest.raises(InvalidSpecError, match="not accepted"):
            check_request("geo", bad, [])
    with pytest.raises(InvalidSpecError, match="image name"):
        check_request("Geo/../x", ["six"], [])
    command = pip_target_command(["six"], Path("/tmp/x"))
    assert "--only-binary=:all:" in command and command[-2:] == ["--", "six"]
