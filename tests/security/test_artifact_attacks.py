"""Hostile programs against artifact collection: each tries to make the host take back something other
than the regular files it wrote under /workspace/out/, in a real sandbox under runc and under runsc,
in both modes that have a sandbox: as a code-action job's program, and as a shell job's program (the
replay model writes it with ``sandbox_write_file`` and runs it with ``sandbox_exec`` in the job's
session sandbox). Both go through the engine (``run_job``), so each case sees the JobResult, the
artifact store and the audit event exactly as a worker makes them.

Collection (sandfleet/worker/sandbox/inside/agent.py ``collect_tree``, checked again by sandfleet/worker/program/artifacts.py) follows no
symlink, reads only regular files (lstat, then O_NOFOLLOW | O_NONBLOCK and fstat), applies the caps
before reading, and refuses names that are not plain relative paths. Each case asserts the mechanism
that refused it: the skipped entry's reason, and that no byte of a file outside the folder came back.
Every case also checks what was kept: the stored bytes hash to the digests the JobResult lists, and
the one ``artifacts`` audit event commits to the same. Outcomes go to
``artifacts/security-results.json`` (see SECURITY.md).
"""

from __future__ import annotations

import hashlib
import json
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from sandfleet.core.contracts import ArtifactInfo, AuditKind, JobResult, JobSpec, SkippedArtifact
from sandfleet.core.settings import Settings
from sandfleet.worker.engine import EngineServices, ListAudit, run_job
from sandfleet.worker.llm.scripted.script import parse_script
from sandfleet.worker.llm.scripted.server import ReplayServer
from sandfleet.worker.sandbox.pool import SandboxPool
from sandfleet.worker.tools.registry import ToolRegistry

from .helpers import BACKEND_OF, TEST_LABELS, assert_no_leftovers, program, record

PASSWD_MARK = b"root:x:0:0"  # /etc/passwd's first line, in every Debian image
MODES = ("code-action", "shell")


@dataclass
class Collected:
    """What one job handed back, the same view in both modes."""

    result: JobResult
    kept: dict[str, bytes]  # name -> the bytes the artifact store holds
    program_result: Any  # the program's RESULT payload (None if it printed none)

    @property
    def infos(self) -> list[ArtifactInfo]:
        return self.result.artifacts

    @property
    def skipped(self) -> list[SkippedArtifact]:
        return self.result.artifacts_skipped

    @property
    def reasons(self) -> dict[str, str]:
        return {s.name: s.reason for s in self.skipped}

    @property
    def cap_hit(self) -> bool:
        return "artifacts" in self.result.limits_hit

    @property
    def collect_s(self) -> float:
        timings = self.result.timings if self.result.mode == "shell" else self.result.attempts[-1].timings
        return timings["artifacts_s"]


@pytest.fixture(scope="module")
def services(docker_engine: Any) -> Iterator[EngineServices]:
    settings = Settings(model_api_key=None, model_base_url=None, max_sessions=2, model_max_retries=0)
    pool = SandboxPool(pool_size=0, max_live=4, labels={**TEST_LABELS, "sandfleet.test.module": __name__})
    with EngineServices(settings, pool, ToolRegistry()) as s:
        yield s


@pytest.fixture(params=MODES)
def mode(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def replies(mode: str, source: str) -> list[Any]:
    """What the replay model answers: the program itself (code-action), or the tool calls that write
    and run it in the session sandbox, then an answer (shell)."""
    if mode == "code-action":
        return [f"```python\n{source}```"]

    def call(name: str, **arguments: Any) -> dict[str, Any]:
        return {"tool_calls": [{"name": name, "arguments": arguments}]}

    return [
        call("sandbox_write_file", path="program.py", content=source),
        call("sandbox_exec", command="python3 -s program.py", timeout=30),
        "RESULT: done",
    ]


@pytest.fixture
def collect(services: EngineServices, mode: str, docker_client: Any) -> Callable[[str, str], Collected]:
    """``collect(source, runtime)``: run ``source`` as a job of ``mode``; what came back, checked for
    consistency (stored bytes, digests, the audit event) and for leftover containers."""

    def collect_one(source: str, runtime: str) -> Collected:
        server = ReplayServer(parse_script({"rules": [{"match": ".", "responses": replies(mode, source)}]}))
        server.start()
        try:
            spec = JobSpec(
                question="hand back files",
                mode=mode,
                model="openai:replay",
                sandbox={"backend": BACKEND_OF[runtime]},
                code_action={"exec_timeout": 20, "max_repairs": 0},
            )
            audit, job_id = ListAudit(), f"sec-{uuid.uuid4().hex[:8]}"
            result = run_job(spec, job_id, services=services, audit=audit, base_url=server.base_url)
        finally:
            server.stop()
        assert result.error is None, result.error
        container = result.session.container_id if result.session else result.attempts[-1].container_id
        assert_no_leftovers(docker_client, container)
        return Collected(
            result, stored_and_audited(services, job_id, result, audit), printed(mode, result, audit)
        )

    return collect_one


def stored_and_audited(
    services: EngineServices, job_id: str, result: JobResult, audit: ListAudit
) -> dict[str, bytes]:
    """The stored bytes of each listed file, each checked against its digest; and the audit event's
    files checked against the listing (no event when nothing at all was there)."""
    kept = {}
    for info in result.artifacts:
        data = services.artifacts.get(job_id, info.sha256)
        assert data is not None and hashlib.sha256(data).hexdigest() == info.sha256 and len(data) == info.size
        kept[info.name] = data
    events = [data for kind, _, data in audit.events if kind == AuditKind.ARTIFACTS]
    if result.artifacts or result.artifacts_skipped:
        [event] = events
        assert event["files"] == [i.model_dump(mode="json") for i in result.artifacts]
        assert event["skipped"] == [s.model_dump(mode="json") for s in result.artifacts_skipped]
    else:
        assert events == []
    return kept


def printed(mode: str, result: JobResult, audit: ListAudit) -> Any:
    """The program's RESULT payload: the job's result (code-action), or the RESULT line the program
    printed in the sandbox_exec the model was shown (shell)."""
    if mode == "code-action":
        return result.result
    for kind, _, data in audit.events:
        if kind == AuditKind.FUNCTION_RESULT and data["tool"] == "sandbox_exec":
            stdout = json.loads(data["shown"])["stdout"]
            lines = [line for line in stdout.splitlines() if line.startswith("RESULT: ")]
            return json.loads(lines[-1][len("RESULT: ") :]) if lines else None
    return None


def case(name: str, mode: str) -> str:
    return name if mode == "code-action" else f"{name} (shell job)"


def test_symlinks_out_of_the_folder_are_never_followed(
    collect: Callable[..., Collected], mode: str, runtime: str
) -> None:
    source = program(
        r"""
        import os, sys
        out = "/workspace/out"
        os.symlink("/etc/passwd", f"{out}/passwd")              # a file outside
        os.symlink("/etc", f"{out}/etc")                        # a folder outside
        os.symlink(os.path.abspath(sys.argv[0]), f"{out}/own")  # a file inside the workdir
        os.makedirs(f"{out}/deep/er")
        os.symlink("/proc/1/environ", f"{out}/deep/er/environ")
        open(f"{out}/ok.txt", "w").write("fine")
        print("RESULT: 1")
        """
    )
    got = collect(source, runtime)
    blocked = (
        list(got.kept) == ["ok.txt"]
        and got.kept["ok.txt"] == b"fine"
        and all(
            got.reasons.get(n) == "a symbolic link (never followed)"
            for n in ("passwd", "etc", "own", "deep/er/environ")
        )
        and all(PASSWD_MARK not in data for data in got.kept.values())
    )
    record(
        case("artifacts: symlinks out of /workspace/out (file, folder, /proc)", mode),
        runtime,
        blocked,
        got.reasons,
    )
    assert blocked, got.reasons


def test_the_folder_itself_swapped_for_a_symlink_is_refused(
    collect: Callable[..., Collected], mode: str, runtime: str
) -> None:
    source = program(
        r"""
        import os
        os.rmdir("/workspace/out")                              # there before the program: both modes
        os.symlink("/etc", "/workspace/out")
        print("RESULT: 1")
        """
    )
    got = collect(source, runtime)
    blocked = got.program_result == 1 and not got.kept and "not a folder" in got.reasons.get(".", "")
    record(
        case("artifacts: /workspace/out replaced by a symlink to /etc", mode), runtime, blocked, got.reasons
    )
    assert blocked, (got.program_result, got.reasons)


def test_fifos_sockets_and_devices_are_refused_without_blocking(
    collect: Callable[..., Collected], mode: str, runtime: str
) -> None:
    source = program(
        r"""
        import json, os, socket
        out = "/workspace/out"
        os.mkfifo(f"{out}/fifo")                                 # a reader that opens it would wait forever
        s = socket.socket(socket.AF_UNIX); s.bind(f"{out}/sock")
        try:
            os.mknod(f"{out}/null", 0o666 | 0o020000, os.makedev(1, 3))   # a character device
            made = "made"
        except OSError as e:
            made = e.errno
        print("RESULT: " + json.dumps({"mknod": made}))
        """
    )
    got = collect(source, runtime)
    mknod = got.program_result["mknod"] if isinstance(got.program_result, dict) else None
    blocked = (
        not got.kept
        and got.reasons.get("fifo") == "a fifo, not a regular file"
        and got.reasons.get("sock") == "a socket, not a regular file"
        and (mknod == 1 or got.reasons.get("null") == "a device, not a regular file")  # EPERM: no CAP_MKNOD
        and got.collect_s < 15  # a reader blocked on the fifo would wait for the channel's timeout
    )
    detail = {**got.reasons, "mknod": mknod}
    record(case("artifacts: fifo, socket and device under /workspace/out", mode), runtime, blocked, detail)
    assert blocked, (detail, got.collect_s)


def test_caps_hold_against_a_sparse_giant_and_a_flood_of_files(
    collect: Callable[..., Collected], mode: str, runtime: str
) -> None:
    source = program(
        r"""
        import os
        out = "/workspace/out"
        with open(f"{out}/giant.bin", "wb") as f:
            f.truncate(50 * 1024**3)                              # 50 GiB, sparse: costs the tmpfs nothing
        for i in range(300):
            open(f"{out}/n{i:03d}.txt", "w").write(str(i))
        print("RESULT: 1")
        """
    )
    got = collect(source, runtime)
    giant = next((s for s in got.skipped if s.name == "giant.bin"), None)
    blocked = (
        giant is not None
        and giant.reason.startswith("larger than the cap")
        and len(got.kept) == 100  # the default cap of files per job
        and got.cap_hit
        and sum(len(d) for d in got.kept.values()) < 1024
    )
    record(
        case("artifacts: a 50 GiB sparse file and 300 files (caps per file and per job)", mode),
        runtime,
        blocked,
        {
            "kept": len(got.kept),
            "giant": giant.reason if giant else None,
            "limits_hit": got.result.limits_hit,
        },
    )
    assert blocked


def test_names_that_are_not_plain_paths_are_refused(
    collect: Callable[..., Collected], mode: str, runtime: str
) -> None:
    source = program(
        r"""
        out = b"/workspace/out"
        open(out + b"/new\nline.txt", "w").write("x")
        open(out + b"/back\\slash.txt", "w").write("x")
        open(out + b"/latin1-\xe9.txt", "w").write("x")           # not UTF-8
        open(out + b"/\x1b[2J\x1b]0;title\x07.txt", "w").write("x")  # C0 escapes: a clear, a window title
        open(out + "/\x9b2J-\u202etxt.exe".encode(), "w").write("csi")  # 8-bit CSI, bidi override: kept
        open(out + b"/plain.txt", "w").write("x")
        print("RESULT: 1")
        """
    )
    got = collect(source, runtime)
    refused = [s for s in got.skipped if "name" in s.reason]
    blocked = (
        sorted(got.kept) == sorted(["plain.txt", "\x9b2J-\u202etxt.exe"])  # exact: shown escaped by readers
        and got.kept["\x9b2J-\u202etxt.exe"] == b"csi"
        and len(refused) == 4
    )
    record(
        case("artifacts: names with a newline, a backslash, non-UTF-8 bytes, terminal escapes", mode),
        runtime,
        blocked,
        [s.reason for s in refused],
    )
    assert blocked, (list(got.kept), got.skipped)


def test_a_file_written_on_after_the_program_ends_is_kept_as_hashed(
    collect: Callable[..., Collected], mode: str, runtime: str
) -> None:
    """A daemonised writer keeps growing and rewriting a file after the program returns: it is killed
    with the command (the agent stops whatever the command left), so what is collected is one state of
    the file, and its stored bytes are the ones the digest and the audit event name."""
    source = program(
        r"""
        import os, time
        out = "/workspace/out"
        if os.fork() == 0:
            os.setsid()
            if os.fork() == 0:
                i = 0
                while True:                                       # grow, then shrink, then grow again
                    with open(f"{out}/moving.log", "a") as f:
                        f.write(f"line {i}\n" * 100)
                    if i % 7 == 6:
                        os.truncate(f"{out}/moving.log", 10)
                    i += 1
            os._exit(0)
        time.sleep(0.5)
        print("RESULT: 1")
        """
    )
    got = collect(source, runtime)
    data = got.kept.get("moving.log", b"")
    [info] = [i for i in got.infos if i.name == "moving.log"] or [None]
    blocked = (
        info is not None
        and len(data) == info.size > 0
        and hashlib.sha256(data).hexdigest() == info.sha256
        and not got.skipped
    )
    record(
        case("artifacts: a file still being rewritten when the program ends", mode), runtime, blocked, info
    )
    assert blocked, (info, len(data), got.skipped)
