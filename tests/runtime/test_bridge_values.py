"""What crosses the bridge: exact JSON values, deterministic conversions, errors as exceptions, the
allow-list, the policy hook and the call records."""

from __future__ import annotations

import json
from typing import Any

import pytest

from sandfleet.worker.program.bridge import CallRequest, PolicyDecision

from . import bridge_tools
from .helpers import program

VALUES: list[Any] = [
    [1, [2, [3, []]], {"a": None}],
    {"nested": {"list": [1.5, "x"], "empty": {}}, "": 0},
    'héllo wörld ✓ 中文 🚀 \u0000 \n\t "quoted" \\ \u2028',
    0,
    -17,
    2**100,
    -(2**70) + 1,
    0.1,
    1e308,
    -2.5e-310,
    -0.0,
    True,
    False,
    None,
]


def test_small_call_round_trips(backend: str, run: Any) -> None:
    done = run(
        program("""
            from sandfleet_tools import add
            print("RESULT:", add(2, b=3)["sum"])
        """),
        backend=backend,
    )

    assert done.ok, (done.failure(), done.stderr)
    assert done.result == 5
    assert [(c.tool, c.args, c.kwargs, c.ok) for c in done.tool_calls] == [("add", [2], {"b": 3}, True)]


def test_values_round_trip_exactly(run: Any) -> None:
    # The program checks equality (and type) inside the container; the host checks what came back.
    source = program(f"""
        import json, math
        from sandfleet_tools import echo
        values = json.loads({json.dumps(VALUES)!r})
        back = [echo(v) for v in values]
        for v, b in zip(values, back):
            assert type(v) is type(b) and v == b, (v, b)
            if isinstance(v, float):
                assert math.copysign(1, v) == math.copysign(1, b), (v, b)
        print("RESULT: " + json.dumps(back))
    """)

    done = run(source)

    assert done.ok, (done.failure(), done.stderr)
    assert done.result == VALUES
    assert [type(v) for v in done.result] == [type(v) for v in VALUES]
    assert [c.result for c in done.tool_calls] == VALUES


def test_lone_surrogates_round_trip(run: Any) -> None:
    done = run(
        program("""
            from sandfleet_tools import echo, fail_with
            assert echo("a\\ud800b") == "a\\ud800b"
            try:
                fail_with("ValueError", "bad \\udfff")
            except ValueError as e:
                assert str(e) == "bad \\udfff", repr(e)
            print("RESULT: ok")
        """)
    )

    assert done.ok, (done.failure(), done.stderr)


def test_values_are_converted_deterministically(run: Any) -> None:
    done = run(
        program("""
            import json
            from sandfleet_tools import converted
            print("RESULT: " + json.dumps(converted()))
        """)
    )

    assert done.ok, (done.failure(), done.stderr)
    assert done.result == {
        "datetime": "2026-07-01T12:30:05",
        "date": "2026-09-30",
        "decimal": "12.30",
        "tuple": [1, "two", [3]],
        "dataclass": {"x": 1, "y": 2},
        "model": {"name": "Ada", "since": "2020-01-02"},
    }


@pytest.mark.parametrize("kind,type_name", [("set", "set"), ("object", "object")])
def test_unconvertible_values_raise_in_the_program(run: Any, kind: str, type_name: str) -> None:
    done = run(
        program(f"""
            import json
            from sandfleet_tools import unconvertible
            try:
                unconvertible({kind!r})
            except Exception as e:
                print("RESULT: " + json.dumps([type(e).__name__, [c.__name__ for c in type(e).__mro__], str(e)]))
        """)
    )

    assert done.ok, (done.failure(), done.stderr)
    name, mro, message = done.result
    assert name == "ValueConversionError" and "ToolError" in mro
    assert type_name in message
    [call] = done.tool_calls
    assert not call.ok and call.error_type == "ValueConversionError"


@pytest.mark.parametrize(
    "kind,expected_mro",
    [
        ("KeyError", "LookupError"),
        ("ValueError", "ValueError"),
        ("InventoryError", "ToolError"),
        ("UnicodeDecodeError", "ValueError"),  # a builtin that cannot be made from a message alone
    ],
)
def test_tool_exceptions_reach_the_program(run: Any, kind: str, expected_mro: str) -> None:
    done = run(
        program(f"""
            import json
            from sandfleet_tools import fail_with
            try:
                fail_with({kind!r}, "no stock for O-0042 ✗")
            except Exception as e:
                print("RESULT: " + json.dumps([type(e).__name__, [c.__name__ for c in type(e).__mro__], str(e)]))
        """)
    )

    assert done.ok, (done.failure(), done.stderr)
    name, mro, message = done.result
    assert name == kind and expected_mro in mro
    assert ("can't decode byte 0xff" if kind == "UnicodeDecodeError" else "no stock for O-0042 ✗") in message
    [call] = done.tool_calls
    assert (call.ok, call.error_type) == (False, kind)


def test_arguments_bind_like_python(run: Any) -> None:
    calls = [
        "add(1)",
        "add(1, 2)",
        "add(a=1, b=2, scale=3)",
        "add(4, scale=2)",
        "add()",
        "add(1, 2, 3)",
        "add(1, c=2)",
        "add(1, a=2)",
    ]
    source = program(f"""
        import json
        from sandfleet_tools import add
        out = []
        for text in {calls!r}:
            try:
                out.append(["ok", eval(text)])
            except Exception as e:
                out.append([type(e).__name__, str(e)])
        print("RESULT: " + json.dumps(out))
    """)

    done = run(source)

    assert done.ok, (done.failure(), done.stderr)
    expected = []
    for text in calls:  # the very same calls of the real function, here on the host
        try:
            expected.append(["ok", eval(text, {"add": bridge_tools.add})])
        except TypeError as e:
            expected.append(["TypeError", str(e)])
    assert done.result == expected
    assert [r[0] for r in done.result] == ["ok"] * 4 + ["TypeError"] * 4


def test_unknown_and_disallowed_tools_raise_naming_the_allowed_ones(run: Any) -> None:
    source = program("""
        import json
        import sandfleet_tools
        from sandfleet_tools import *
        out = [sorted(sandfleet_tools.__all__), "big_text" in globals()]
        for name in ("big_text", "no_such_tool"):
            try:
                sandfleet_tools._call(name, [1], {})
            except Exception as e:
                out.append([type(e).__name__, str(e)])
        print("RESULT: " + json.dumps(out))
    """)

    done = run(source, tools=["echo", "add"])

    assert done.ok, (done.failure(), done.stderr)
    names, exposed, disallowed, unknown = done.result
    assert names == ["add", "echo"] and exposed is False
    for error, tool in ((disallowed, "big_text"), (unknown, "no_such_tool")):
        assert error[0] == "NameError"
        assert tool in error[1] and "allowed tools: add, echo" in error[1]
    assert [c.ok for c in done.tool_calls] == [False, False]


def test_policy_hook_sees_each_call_and_can_deny(run: Any) -> None:
    seen: list[CallRequest] = []

    def policy(request: CallRequest) -> PolicyDecision | bool:
        seen.append(request)
        if request.tool == "add" and request.kwargs.get("scale") == 1000:
            return PolicyDecision(False, "scale 1000 needs approval")
        return request.tool != "big_text"

    source = program("""
        import json
        from sandfleet_tools import add, big_text
        out = [add(1, 2)]
        for call in (lambda: add(1, scale=1000), lambda: big_text(3)):
            try:
                out.append(call())
            except Exception as e:
                out.append([type(e).__name__, str(e)])
        print("RESULT: " + json.dumps(out))
    """)

    done = run(source, policy=policy, job_id="job-policy-1")

    assert done.ok, (done.failure(), done.stderr)
    assert done.result == [
        {"sum": 3},
        ["PermissionError", "call to add denied by policy: scale 1000 needs approval"],
        ["PermissionError", "call to big_text denied by policy"],
    ]
    assert [(r.tool, r.args, r.kwargs, r.job_id, r.seq) for r in seen] == [
        ("add", [1, 2], {}, "job-policy-1", 1),
        ("add", [1], {"scale": 1000}, "job-policy-1", 2),
        ("big_text", [3], {}, "job-policy-1", 3),
    ]
    assert [(c.ok, c.error_type) for c in done.tool_calls] == [
        (True, None),
        (False, "PermissionError"),
        (False, "PermissionError"),
    ]


def test_every_call_is_recorded(run: Any) -> None:
    source = program("""
        from sandfleet_tools import add, echo, fail_with
        add(1, b=2)
        echo({"k": [1, 2, 3]})
        try:
            fail_with("KeyError", "missing")
        except KeyError:
            pass
        print("RESULT: 1")
    """)

    done = run(source)

    assert done.ok, (done.failure(), done.stderr)
    first, second, third = done.tool_calls
    assert [c.seq for c in done.tool_calls] == [1, 2, 3]
    assert (first.tool, first.args, first.kwargs, first.ok, first.result) == (
        "add",
        [1],
        {"b": 2},
        True,
        {"sum": 3},
    )
    assert (second.tool, second.args, second.result) == ("echo", [{"k": [1, 2, 3]}], {"k": [1, 2, 3]})
    assert first.result_size > 0 and second.result_size > first.result_size
    assert (third.tool, third.ok, third.error_type, third.error) == (
        "fail_with",
        False,
        "KeyError",
        "missing",
    )
    assert all(c.duration_ms >= 0 for c in done.tool_calls)
    assert done.timings["tool_s"] >= 0 and "tool_calls" not in done.limits_hit
