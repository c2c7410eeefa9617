"""``sandfleet submit | batch | result | audit | jobs`` against a real Redis (commands run in-process)."""

from __future__ import annotations

import csv
import json
import threading
import time
from pathlib import Path

import redis
from click.testing import CliRunner

from sandfleet.cli import main
from sandfleet.core.contracts import JobResult, JobStatus
from sandfleet.core.priority import priority_lists, queue_length
from sandfleet.core.queue import queue_name
from sandfleet.core.settings import Settings
from sandfleet.core.store import JobStore
from sandfleet.producer.client import Client
from sandfleet.worker.delivery.job_end import error_result

from .helpers import keys_under


def run(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(main, list(args), catch_exceptions=False)
    return result.exit_code, result.stdout, result.stderr


def finish_soon(
    store: JobStore, client: Client, count: int, value: object = None, delay_s: float = 0.1
) -> threading.Thread:
    """Plays the worker's record writes for the first ``count`` queued jobs (the CLI only reads records)."""

    def finish() -> None:
        deadline = time.monotonic() + 10
        done: set[str] = set()
        while len(done) < count and time.monotonic() < deadline:
            for record in client.jobs(status="queued"):
                time.sleep(delay_s)
                store.mark_running(record.job_id, "w")
                result = value if value is not None else {"question": record.spec.question}
                store.finish(
                    record.job_id, JobResult(job_id=record.job_id, status=JobStatus.SUCCEEDED, result=result)
                )
                done.add(record.job_id)
            time.sleep(0.02)

    thread = threading.Thread(target=finish)
    thread.start()
    return thread


def test_submit_prints_the_job_id(
    cli_env: dict, client: Client, raw_redis: redis.Redis, settings: Settings
) -> None:
    code, out, _ = run(
        "submit", "What is 6 x 7?", "--tools", "load_orders, send_mail", "-o", "memory_limit=512M"
    )
    assert code == 0
    job_id = out.strip()
    record = client.get(job_id).record()
    assert (
        record.spec.tools == ["load_orders", "send_mail"]
        and record.spec.sandbox["memory_limit"] == 512 * 1024**2
    )
    assert queue_length(raw_redis, queue_name(settings)) == 1


def test_submit_refuses_a_bad_option_and_enqueues_nothing(
    cli_env: dict, raw_redis: redis.Redis, settings: Settings
) -> None:
    code, _, err = run("submit", "q", "-o", "network_mode=host", "--max-repairs", "99")
    assert code == 2
    assert (
        "'network_mode' (use `network`" in err
        and "code_action.max_repairs" in err
        and "nothing was enqueued" in err
    )
    assert keys_under(raw_redis, settings.key_prefix) == []


def test_submit_wait_prints_the_result_payload_exactly(
    cli_env: dict, client: Client, store: JobStore
) -> None:
    worker = finish_soon(store, client, 1, value={"North America": 108664.0, "APAC": 65023.0})
    code, out, _ = run("submit", "Revenue?", "--wait", "--timeout", "10")
    worker.join()
    assert code == 0
    assert json.loads(out) == {"North America": 108664.0, "APAC": 65023.0}
    assert list(json.loads(out)) == ["North America", "APAC"]


def test_submit_wait_times_out_with_exit_3(cli_env: dict) -> None:
    code, _, err = run("submit", "Nobody runs me", "--wait", "--timeout", "0.2")
    assert code == 3 and "has not ended after 0.2 s" in err


def test_result_and_jobs(cli_env: dict, client: Client, store: JobStore) -> None:
    job = client.submit("Plain text answer?")
    code, _, err = run("result", job.job_id)
    assert code == 3 and "is queued" in err
    store.finish(job.job_id, JobResult(job_id=job.job_id, status=JobStatus.SUCCEEDED, result="forty-two"))
    assert run("result", job.job_id)[:2] == (0, "forty-two\n")
    code, out, _ = run("result", job.job_id, "--json")
    data = json.loads(out)
    assert data.pop("verified") is True and JobResult.model_validate(data).result == "forty-two"

    failed = client.submit("Will fail")
    store.finish(
        failed.job_id,
        error_result(
            failed.job_id, JobStatus.FAILED, "sandbox_unavailable", "sandbox unavailable: docker down"
        ),
    )
    code, _, err = run("result", failed.job_id)
    assert code == 1 and "failed: sandbox_unavailable: sandbox unavailable: docker down" in err

    code, out, _ = run("jobs", "--status", "succeeded", "--json")
    (line,) = [json.loads(x) for x in out.splitlines()]
    assert line["job_id"] == job.job_id and line["question"] == "Plain text answer?"
    code, out, _ = run("jobs")
    assert job.job_id in out and failed.job_id in out
    assert run("result", "no-such-job")[0] == 1


def test_audit_lists_events_and_verifies_the_chain(
    cli_env: dict, client: Client, store: JobStore, settings: Settings
) -> None:
    job = client.submit("Audit me")
    store.mark_running(job.job_id, "w")
    code, out, _ = run("audit", job.job_id, "--json")
    assert code == 0 and [json.loads(x)["kind"] for x in out.splitlines()] == ["state"]
    code, out, _ = run("audit", job.job_id, "--verify")
    assert code == 0 and "audit chain holds (1 events)" in out

    stream = store.keys.audit(job.job_id)
    ((_entry_id, fields),) = store.redis.xrange(stream)
    store.redis.delete(stream)
    store.redis.xadd(stream, {**fields, "event": fields["event"].replace("queued", "running")})
    code, out, err = run("audit", job.job_id, "--verify", "--json")
    assert code == 1 and "audit chain BROKEN at event 0" in err
    assert json.loads(out)["data"]["status"] == "running"


def write_csv(path: Path, rows: list[dict[str, str]]) -> Path:
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    return path


def test_batch_refuses_bad_rows_by_line_number_and_enqueues_nothing(
    cli_env: dict, tmp_path: Path, raw_redis: redis.Redis, settings: Settings
) -> None:
    jsonl = tmp_path / "jobs.jsonl"
    jsonl.write_text(
        '{"question": "fine"}\n\n{"question": "bad", "tools": ["no way"]}\nnot json\n{"question": "x", "colour": 1}\n'
    )
    code, _, err = run("batch", str(jsonl))
    assert code == 2
    assert "line 3: tools: tool names are Python identifiers" in err
    assert "line 4: not JSON" in err and "line 5: colour: Extra inputs are not permitted" in err
    assert "line 1" not in err

    rows = [
        {"question": "ok", "tools": "load_orders", "sandbox": ""},
        {"question": "ok", "tools": "", "sandbox": "{bad"},
    ]
    code, _, err = run("batch", str(write_csv(tmp_path / "jobs.csv", rows)))
    assert code == 2 and "line 3: sandbox: not JSON" in err
    assert keys_under(raw_redis, settings.key_prefix) == []


def test_batch_from_csv_waits_with_progress_and_writes_results(
    cli_env: dict, tmp_path: Path, client: Client, store: JobStore
) -> None:
    rows = [
        {"question": f"question {i}", "tools": "load_orders,send_mail", "code_action": '{"max_repairs": 0}'}
        for i in range(5)
    ]
    source = write_csv(tmp_path / "in.csv", rows)
    worker = finish_soon(store, client, 5, delay_s=0.02)
    code, out, err = run("batch", str(source), "--out", str(tmp_path / "out.csv"), "--timeout", "20")
    worker.join()
    assert code == 0, err
    batch_id = out.strip()
    assert "5/5 done (succeeded 5)" in err
    with (tmp_path / "out.csv").open(newline="") as f:
        written = list(csv.DictReader(f))
    assert [r["line"] for r in written] == ["2", "3", "4", "5", "6"]
    assert all(r["status"] == "succeeded" for r in written)
    assert json.loads(written[0]["result"]) == {"question": "question 0"}
    records = client.jobs(batch=batch_id)
    assert [r.spec.question for r in records] == [f"question {i}" for i in range(5)]
    assert (
        records[0].spec.tools == ["load_orders", "send_mail"] and records[0].spec.code_action.max_repairs == 0
    )


def test_batch_from_jsonl_writes_jsonl(
    cli_env: dict, tmp_path: Path, client: Client, store: JobStore
) -> None:
    source = tmp_path / "in.jsonl"
    source.write_text(
        "".join(json.dumps({"question": f"q{i}", "metadata": {"n": i}}) + "\n" for i in range(3))
    )
    worker = finish_soon(store, client, 3, delay_s=0.02)
    code, _, err = run("batch", str(source), "--out", str(tmp_path / "out.jsonl"), "--timeout", "20")
    worker.join()
    assert code == 0, err
    lines = [json.loads(x) for x in (tmp_path / "out.jsonl").read_text().splitlines()]
    assert [(x["line"], x["question"], x["status"]) for x in lines] == [
        (i + 1, f"q{i}", "succeeded") for i in range(3)
    ]
    assert lines[0]["result"] == {"question": "q0"}


def test_batch_without_wait_prints_the_batch_id(cli_env: dict, tmp_path: Path, client: Client) -> None:
    source = tmp_path / "in.jsonl"
    source.write_text('{"question": "a"}\n{"question": "b"}\n')
    code, out, _ = run("batch", str(source), "--batch-id", "nightly-1")
    assert (code, out.strip()) == (0, "nightly-1")
    assert client.batch("nightly-1").progress().counts["queued"] == 2


def test_submit_and_batch_take_a_mode_and_jobs_shows_it(
    cli_env: dict, client: Client, raw_redis: redis.Redis, settings: Settings, tmp_path: Path
) -> None:
    code, out, _ = run("submit", "Chat about it", "--mode", "chat", "--tools", "load_orders")
    assert code == 0 and client.get(out.strip()).record().spec.mode == "chat"
    lists = priority_lists(queue_name(settings))
    (message,) = [json.loads(m) for key in lists for m in raw_redis.lrange(key, 0, -1)]
    assert message["headers"]["argsrepr"] == "['chat', 'Chat about it']"  # what Flower shows

    source = tmp_path / "jobs.jsonl"
    source.write_text('{"question": "row one"}\n{"question": "row two", "mode": "code-action"}\n')
    code, out, _ = run("batch", str(source), "--mode", "shell")
    assert code == 0
    modes = {r.spec.question: r.spec.mode for r in client.jobs(batch=out.strip())}
    assert modes == {"row one": "shell", "row two": "code-action"}  # a row's own mode wins

    code, out, _ = run("jobs")
    assert "  queued     chat         p5" in out and "  queued     shell        p3" in out
    code, out, _ = run("jobs", "--json")
    assert sorted(json.loads(line)["mode"] for line in out.splitlines()) == ["chat", "code-action", "shell"]


def test_a_mode_that_does_not_exist_is_refused_and_nothing_enqueued(
    cli_env: dict, raw_redis: redis.Redis, settings: Settings, tmp_path: Path
) -> None:
    code, _, err = run("submit", "q", "--mode", "agent")
    assert code == 2 and "'agent' is not one of 'code-action', 'shell', 'chat'" in err
    source = tmp_path / "jobs.jsonl"
    source.write_text('{"question": "fine"}\n{"question": "bad", "mode": "agentic"}\n')
    code, _, err = run("batch", str(source))
    assert code == 2 and "line 2: mode: Input should be 'code-action', 'shell' or 'chat'" in err
    assert keys_under(raw_redis, settings.key_prefix) == []
