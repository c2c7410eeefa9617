"""Approver keys, the approvers file and signed decisions, with no Redis and no worker: every way a
key file, the operator's file or a decision is refused, and the words of each refusal. (Through a real
worker: tests/approvals/test_signed_decisions.py.)"""

from __future__ import annotations

import json
import os
import stat
import subprocess
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization
from fleet.helpers import SANDFLEET

from sandfleet.core.approvers import (
    ApproversFile,
    load_approver_key,
    make_approver_key,
    public_half_path,
    read_public_key,
)
from sandfleet.core.decisions import (
    MAX_DECISION_BYTES,
    Expected,
    check_decision,
    sign_decision,
)
from sandfleet.core.errors import ApproverKeyError

SHA = "c" * 64


@pytest.fixture
def ana(tmp_path: Path):  # type: ignore[no-untyped-def]
    return make_approver_key(tmp_path / "ana" / "key.pem")


@pytest.fixture
def listed(tmp_path: Path, ana) -> ApproversFile:  # type: ignore[no-untyped-def]
    approvers = ApproversFile(tmp_path / "approvers.json")
    approvers.add("ana", *read_public_key(public_half_path(tmp_path / "ana" / "key.pem")))
    return approvers


def expected(status: str = "approved") -> Expected:
    return Expected("job-1", "apr-1", SHA, status, "ana")  # type: ignore[arg-type]


def signed(key, **overrides: object) -> str:  # type: ignore[no-untyped-def]
    fields = {
        "job_id": "job-1",
        "request_id": "apr-1",
        "call_sha256": SHA,
        "decision": "approved",
        "by": "ana",
    }
    return sign_decision(key, **(fields | overrides)).text()  # type: ignore[arg-type]


def test_keygen_writes_a_private_key_only_its_owner_reads_and_never_overwrites_it(tmp_path: Path) -> None:
    path = tmp_path / "approver" / "key.pem"
    key = make_approver_key(path)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600 and stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    assert load_approver_key(path).key_id == key.key_id
    assert read_public_key(public_half_path(path)) == (key.key_id, key.info.public_key)
    with pytest.raises(ApproverKeyError, match="is never overwritten"):
        make_approver_key(path)
    os.chmod(path, 0o644)
    with pytest.raises(ApproverKeyError, match=r"readable by others \(mode 0644\).*chmod 600"):
        load_approver_key(path)
    with pytest.raises(ApproverKeyError, match="sandfleet approvers keygen"):
        load_approver_key(tmp_path / "missing.pem")


def test_a_public_key_is_read_from_keygens_json_or_a_pem_and_a_wrong_key_id_is_refused(
    tmp_path: Path, ana
) -> None:  # type: ignore[no-untyped-def]
    pem = tmp_path / "ana.pub.pem"
    public = serialization.load_pem_private_key(ana.pem(), None).public_key()
    pem.write_bytes(
        public.public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    )
    assert read_public_key(pem)[0] == ana.key_id
    forged = tmp_path / "forged.pub.json"
    data = json.loads(public_half_path(tmp_path / "ana" / "key.pem").read_text()) | {"key_id": "0" * 32}
    forged.write_text(json.dumps(data))
    with pytest.raises(ApproverKeyError, match=r"names key id 0+, but its public key's id is"):
        read_public_key(forged)
    (tmp_path / "junk").write_text("{}")
    with pytest.raises(ApproverKeyError, match="not an approver's public key"):
        read_public_key(tmp_path / "junk")


def test_the_approvers_file_adds_lists_and_revokes_and_is_read_again_when_it_changes(
    tmp_path: Path, listed: ApproversFile, ana
) -> None:  # type: ignore[no-untyped-def]
    assert [(e.name, e.key_id, e.status) for e in listed.entries()] == [("ana", ana.key_id, "active")]
    assert stat.S_IMODE(listed.path.stat().st_mode) == 0o644
    ring = listed.ring()
    bo = make_approver_key(tmp_path / "bo.pem")
    listed.add("bo", bo.key_id, bo.info.public_key)
    assert bo.key_id in listed.ring() and bo.key_id not in ring  # the same object reads the new file
    second = make_approver_key(tmp_path / "bo-second.pem")
    with pytest.raises(ApproverKeyError, match="has an active key"):
        listed.add("bo", second.key_id, second.info.public_key)
    [revoked] = listed.revoke("bo")
    assert revoked.status == "revoked" and revoked.revoked_at
    with pytest.raises(ApproverKeyError, match="is revoked already"):
        listed.add("bob", bo.key_id, bo.info.public_key)  # a revoked key never comes back
    with pytest.raises(ApproverKeyError, match="no active approver or key 'bo'"):
        listed.revoke("bo")
    assert [e.status for e in ApproversFile(listed.path).entries()] == ["active", "revoked"]


def test_an_approvers_file_others_could_write_or_with_a_forged_entry_is_refused_whole(
    listed: ApproversFile, ana
) -> None:  # type: ignore[no-untyped-def]
    os.chmod(listed.path, 0o664)
    with pytest.raises(ApproverKeyError, match=r"writable by group or others \(mode 0664\).*chmod go-w"):
        listed.ring()
    os.chmod(listed.path, 0o644)
    data = json.loads(listed.path.read_text())
    mallory = make_approver_key(listed.path.parent / "mallory.pem")
    data["approvers"][0]["public_key"] = mallory.info.public_key  # ana's key id, mallory's public key
    listed.path.write_text(json.dumps(data))
    with pytest.raises(ApproverKeyError, match=f"key id {ana.key_id} .* is not the hash of its public key"):
        ApproversFile(listed.path).ring()
    with pytest.raises(ApproverKeyError, match="does not exist"):
        ApproversFile(listed.path.parent / "none.json").ring()


def test_a_decision_holds_only_signed_listed_for_this_request_call_and_verdict(
    tmp_path: Path, listed: ApproversFile, ana
) -> None:  # type: ignore[no-untyped-def]
    good = check_decision(signed(ana), expected(), listed, allow_unsigned=False)
    assert good.accepted and good.approver == "ana" and good.key_id == ana.key_id
    assert good.audit_fields()["decision"]["signature"]

    def problem(
        raw: str | None, want: Expected | None = None, approvers: ApproversFile | None = listed
    ) -> str:
        check = check_decision(raw, want or expected(), approvers, allow_unsigned=False)
        assert not check.accepted
        return check.problem

    what = "decision for job job-1 request apr-1"
    assert problem(None).startswith(f"{what} is not signed: refused")
    assert "has no approvers file" in problem(None, approvers=None)
    assert "has no approvers file" in problem(signed(ana), approvers=None)
    assert problem("not json").startswith(f"{what} is not a signed decision (")
    assert "more than the" in problem("x" * (MAX_DECISION_BYTES + 1))
    assert problem("[" * 50 + "]" * 50).startswith(
        f"{what} is not a signed decision ("
    )  # past the nesting cap
    mallory = make_approver_key(tmp_path / "m.pem")
    assert problem(signed(mallory)) == (
        f"{what} is signed by key {mallory.key_id}, which is not in {listed.source}: refused"
    )
    assert "replayed from another request" in problem(signed(ana, request_id="apr-2"))
    assert "replayed from another request" in problem(signed(ana, job_id="job-2"))
    assert "signed for the call with SHA-256 dddd" in problem(signed(ana, call_sha256="d" * 64))
    assert "the request says approved, its signed decision says denied" in problem(
        signed(ana, decision="denied")
    )
    edited = json.loads(signed(ana))
    edited["decision"]["reason"] = "changed"
    assert "its signature does not verify" in problem(json.dumps(edited))
    listed.revoke("ana")
    assert f"of approver ana, which is revoked in {listed.source}" in problem(signed(ana))
    assert check_decision(None, expected(), None, allow_unsigned=True).accepted  # allowed: unsigned only
    assert not check_decision(signed(mallory), expected(), None, allow_unsigned=True).accepted


def _approvers(*args: str, home: Path) -> subprocess.CompletedProcess[str]:
    env = {
        "PATH": "/usr/bin:/bin",
        "HOME": str(home),
        "SANDFLEET_APPROVERS_FILE": str(home / "approvers.json"),
    }
    return subprocess.run(
        [SANDFLEET, "approvers", *args], capture_output=True, text=True, env=env, timeout=60
    )


def test_the_approvers_commands_make_a_key_list_it_and_revoke_it(tmp_path: Path) -> None:
    made = _approvers("keygen", home=tmp_path)  # default: ~/.sandfleet/approver/key.pem
    assert made.returncode == 0, made.stderr
    key = tmp_path / ".sandfleet" / "approver" / "key.pem"
    public = public_half_path(key)
    assert stat.S_IMODE(key.stat().st_mode) == 0o600 and str(public) in made.stdout
    assert _approvers("keygen", home=tmp_path).returncode == 1  # never overwritten
    added = _approvers("add", "ana", "--key", str(public), home=tmp_path)
    assert added.returncode == 0 and "active   ana" in added.stdout, added.stderr
    again = _approvers("add", "ana2", "--key", str(public), home=tmp_path)
    assert again.returncode == 1 and "listed already" in again.stderr
    bad = _approvers("add", "ana\x1b[2J", "--key", str(public), home=tmp_path)
    assert bad.returncode == 2
    [entry] = [json.loads(line) for line in _approvers("list", "--json", home=tmp_path).stdout.splitlines()]
    assert entry["name"] == "ana" and entry["key_id"] == load_approver_key(key).key_id
    revoked = _approvers("revoke", "ana", home=tmp_path)
    assert revoked.returncode == 0 and "revoked  ana" in revoked.stdout
    assert "revoked" in _approvers("list", home=tmp_path).stdout
    assert _approvers("revoke", "ana", home=tmp_path).returncode == 1
