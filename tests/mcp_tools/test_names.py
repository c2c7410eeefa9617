"""MCP tool names: Python identifiers, unique across servers and beside Python tools, stable."""

from __future__ import annotations

from sandfleet.core.contracts import JobSpec
from sandfleet.worker.mcp.names import identifier_part, server_of, server_prefixes, tool_names


def test_names_are_identifiers_made_of_server_and_tool() -> None:
    prefixes = server_prefixes(["time", "my-db", "9lives", "über"])
    names = tool_names(
        {
            "time": ["get_current_time"],
            "my-db": ["run query", "class"],
            "9lives": ["x"],
            "über": ["get-weather.now"],
        },
        prefixes,
    )
    assert names == {
        ("time", "get_current_time"): "time__get_current_time",
        ("my-db", "run query"): "my_db__run_query",
        ("my-db", "class"): "my_db__class",
        ("9lives", "x"): "t9lives__x",
        ("über", "get-weather.now"): "ber__get_weather_now",
    }
    for name in names.values():
        assert name.isidentifier() and name.isascii()
        JobSpec(question="q", tools=[name])  # a job's allow-list can name it


def test_two_servers_with_the_same_tool_are_both_reachable() -> None:
    names = tool_names({"a": ["search"], "b": ["search"]}, server_prefixes(["a", "b"]))
    assert names == {("a", "search"): "a__search", ("b", "search"): "b__search"}


def test_clashes_get_numbered_in_config_order_and_python_tools_keep_their_names() -> None:
    prefixes = server_prefixes(["my-db", "my_db"])
    assert prefixes == {"my-db": "my_db", "my_db": "my_db_2"}
    names = tool_names({"my-db": ["a-b", "a_b", "q"], "my_db": ["q"]}, prefixes, taken=["my_db__q"])
    assert names == {
        ("my-db", "a-b"): "my_db__a_b",
        ("my-db", "a_b"): "my_db__a_b_2",
        ("my-db", "q"): "my_db__q_2",  # the Python tool my_db__q keeps its name
        ("my_db", "q"): "my_db_2__q",
    }
    assert tool_names({"my-db": ["a-b", "a_b", "q"], "my_db": ["q"]}, prefixes, taken=["my_db__q"]) == names


def test_long_names_are_cut_within_the_limit_and_stay_distinct() -> None:
    long = "x" * 150
    names = tool_names({"s": [long, long + "y"]}, server_prefixes(["s"]))
    first, second = names[("s", long)], names[("s", long + "y")]
    assert len(first) <= 100 and len(second) <= 100 and first != second
    JobSpec(question="q", tools=[first, second])


def test_the_server_of_a_name_is_found_by_its_prefix() -> None:
    prefixes = server_prefixes(["git", "git-hub"])
    assert server_of("git__git_log", prefixes) == "git"
    assert server_of("git_hub__search", prefixes) == "git-hub"
    assert server_of("load_orders", prefixes) is None


def test_identifier_parts_never_start_with_a_digit_or_underscore() -> None:
    assert identifier_part("__private") == "private"
    assert identifier_part("") == "tool" and identifier_part("---") == "tool"
    assert identifier_part("2fa") == "t2fa"
