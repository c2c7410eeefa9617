"""Which resource URIs a program may read (listed, or matching a template), the value a read becomes,
and the MCP status report as a worker writes it and ``sandfleet doctor`` reads it back. Pure."""

from __future__ import annotations

import json

import mcp_types as types
import pytest

from sandfleet.worker.mcp.resources import (
    MAX_URI_CHARS,
    ResourceIndex,
    UriTemplate,
    resource_value,
)
from sandfleet.worker.mcp.status import MAX_TEXT_CHARS, ServerStatus, from_report, to_report

INDEX = ResourceIndex.of(
    ["data://notes.txt", "data://logo.png"],
    ["notes://{day}", "file:///data/{name}", "repo://{+path}", "search://q{?a,b}", "mail://{/box}"],
)


@pytest.mark.parametrize(
    "uri",
    [
        "data://notes.txt",
        "notes://monday",
        "file:///data/report.csv",
        "repo://src/app/main.py",
        "search://q?a=1&b=2",
        "search://q",
        "mail:///inbox/2026",
    ],
)
def test_listed_uris_and_uris_matching_a_template_are_accepted(uri: str) -> None:
    assert INDEX.check("s", uri) == uri


@pytest.mark.parametrize(
    "uri",
    [
        "secret://token",  # not listed, no template
        "data://notes.txt.bak",  # listed URIs match exactly
        "notes://",  # a simple value is never empty
        "notes://a/b",  # a simple value holds no '/'
        "file:///data/..",  # dot segments, raw or encoded
        "file:///data/%2e%2e",
        "file:///data/a%2Fb",  # an encoded '/' in a simple value
        "file:///data/a%5cb",  # an encoded backslash
        "repo://src/../../etc/passwd",  # reserved expansion: '/' allowed, '..' never
        "repo://%2e%2e/etc",
        "notes://monday#x",
        "NOTES://monday",  # case matters, as the server wrote it
    ],
)
def test_other_uris_are_refused_with_what_the_server_offered(uri: str) -> None:
    with pytest.raises(ValueError) as refused:
        INDEX.check("lab", uri)
    message = str(refused.value)
    assert message.startswith("MCP server 'lab' did not list the resource")
    assert "2 listed: data://notes.txt, data://logo.png" in message and "templates: notes://{day}" in message


def test_a_uri_must_be_a_string_of_bounded_length() -> None:
    with pytest.raises(TypeError, match="uri must be a string, not list"):
        INDEX.check("s", ["data://notes.txt"])
    with pytest.raises(ValueError, match=f"longer than {MAX_URI_CHARS}"):
        INDEX.check("s", "notes://" + "a" * MAX_URI_CHARS)


def test_templates_this_module_cannot_read_match_nothing() -> None:
    assert UriTemplate.parse("notes://{day") is None
    assert UriTemplate.parse("notes://{day}}") is None
    assert UriTemplate.parse("") is None
    index = ResourceIndex.of([], ["broken://{x", "x" * (MAX_URI_CHARS + 1)])
    assert not index and index.offered() == "none listed"


def test_an_index_keeps_bounded_uris_once_and_says_what_it_offers_briefly() -> None:
    uris = [f"data://{i}.txt" for i in range(8)] + ["data://0.txt", "", "x" * (MAX_URI_CHARS + 1)]
    index = ResourceIndex.of(uris, [])
    assert len(index.uris) == 8 and index.listed[0] == "data://0.txt"
    assert (
        index.offered()
        == "8 listed: data://0.txt, data://1.txt, data://2.txt, data://3.txt, data://4.txt ..."
    )


def test_a_read_becomes_the_programs_value_like_an_embedded_resource() -> None:
    text = types.TextResourceContents(uri="data://notes.txt", mime_type="text/plain", text="the notes")
    blob = types.BlobResourceContents(uri="data://logo.png", mime_type="image/png", blob="iVBORw0=")
    assert resource_value(types.ReadResourceResult(contents=[text])) == {
        "type": "resource",
        "uri": "data://notes.txt",
        "mime_type": "text/plain",
        "text": "the notes",
    }
    both = resource_value(types.ReadResourceResult(contents=[text, blob]))
    assert [v.get("text", v.get("data")) for v in both] == ["the notes", "iVBORw0="]
    assert resource_value(types.ReadResourceResult(contents=[])) is None


# ---- the status report a worker publishes with its heartbeat ----------------------------------------


def status(**fields: object) -> ServerStatus:
    base: dict[str, object] = dict(
        name="lab", where="http: http://127.0.0.1:1/mcp", up=True, detail="3 tools, protocol 2026-07-28",
        fix="", tools=3, restarts=1, resources=2, since=1.5e9, ping_ms=2.5, notified=4, refreshes=2,
    )  # fmt: skip
    return ServerStatus(**{**base, **fields})  # type: ignore[arg-type]


def test_the_report_reads_back_as_it_was_written() -> None:
    statuses = [
        status(),
        status(name="time", up=False, detail="cannot connect", fix="start it", ping_ms=None),
    ]
    report = to_report(statuses)
    assert set(report) == {"lab", "time"}
    raw = {k.encode(): v.encode() for k, v in report.items()}  # as redis-py hands a hash back
    assert from_report(raw) == statuses


@pytest.mark.parametrize(
    "value",
    [
        "not json",
        "[1, 2]",
        "[" * 3000 + "]" * 3000,  # nested past any parser's comfort: refused before parsing
        json.dumps({**json.loads(to_report([status()])["lab"]), "up": "yes"}),  # a wrong type
        json.dumps({**json.loads(to_report([status()])["lab"]), "tools": 1.5}),
        json.dumps({**json.loads(to_report([status()])["lab"]), "since": float("nan")}),
        json.dumps({k: v for k, v in json.loads(to_report([status()])["lab"]).items() if k != "fix"}),
        "x" * 10_000,
    ],
)
def test_a_report_entry_written_by_someone_else_is_left_out(value: str) -> None:
    assert from_report({"lab": value, "good": to_report([status(name="good")])["good"]}) == [
        status(name="good")
    ]


def test_report_texts_are_cut_and_entries_capped() -> None:
    long = status(detail="d" * 5000)
    [back] = from_report(
        {"lab": json.dumps({**json.loads(to_report([status()])["lab"]), "detail": "d" * 5000})}
    )
    assert back.detail == "d" * MAX_TEXT_CHARS and long.detail != back.detail
    many = {f"s{i:03d}": to_report([status(name=f"s{i:03d}")])[f"s{i:03d}"] for i in range(150)}
    assert len(from_report(many)) == 100
