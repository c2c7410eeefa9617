"""How much work checking a value against an MCP tool's schema can take, bounded before any check runs.

A server's schema is small text, but ``$ref`` s and ``anyOf``/``oneOf``/``allOf`` can make jsonschema
visit one value exponentially many times: ``A = {"oneOf": [{"$ref": "#/$defs/B"}, {"$ref":
"#/$defs/B"}]}``, ``B`` the same over ``C``, ... 30 such definitions (under 2 KB, 2 levels deep) visit
each argument 2**30 times: minutes of a bridge thread per call for one call, and no way to stop it.
So when the catalog reads a tool, :func:`visits_per_value` computes the most times any one value of an
argument (or of a structured result) can be visited, following local ``$ref`` s with memoised
resolution, and a tool whose schema exceeds :data:`MAX_VISITS_PER_VALUE` is not offered, naming why.
A call's check then costs at most its number of values times that bound, which the bridge checks
against :data:`MAX_CHECK_VISITS` before it starts (:func:`check_call_budget`): the program's
arguments cannot multiply a large bound into a long check either.

How it counts: the subschemas applied to the same value (``allOf``, ``anyOf``, ``oneOf``, ``not``,
``if``/``then``/``else``, ``dependentSchemas``, ``$ref``) multiply; those applied to the values inside
it (``properties``, ``items``, ``additionalProperties``, ...) are taken for the worst single child at
each depth, down to :data:`~sandfleet.core.json_limits.MAX_JSON_DEPTH`, the deepest a value may nest,
so a recursive schema (a tree of nodes) is bounded too. ``unevaluated*`` re-evaluate the subschemas of
their level, so that level counts twice. What cannot be bounded is refused: a ``$ref`` cycle that
never enters the value (validation would never end), a ``$ref`` that is not a local JSON pointer
(``$id`` bases, anchors, ``$dynamicRef``: another document, or one this reader cannot follow), a
schema of more than :data:`MAX_SCHEMA_NODES` subschemas. Pure.
"""

from __future__ import annotations

from collections import Counter
from typing import Any
from urllib.parse import unquote

from sandfleet.core.json_limits import MAX_JSON_DEPTH

MAX_VISITS_PER_VALUE = 1_000
"""The most times one value may be visited by a tool's schema. Real tools: 1-20 (a union of a few
models, each with a nested union); the 30-definition chain above: about 10**9. A recursive union
(an expression tree whose nodes are ``anyOf`` two kinds of node) doubles per level: it is refused,
its worst case being exponential in the argument's depth."""

MAX_CHECK_VISITS = 500_000
"""The most visits one call's check may take (values x visits per value). Measured with jsonschema on
this host: ~2 us a plain visit (a megabyte of integers, 250,000 values, checks in about 0.5 s) and
~20 us one through ``$ref`` and ``oneOf`` (2**16 leaves took 5.5 s): at worst ~10 s of one bridge
thread, which jsonschema (pure Python) shares with the worker's other threads."""

MAX_SCHEMA_NODES = 5_000  # subschemas a tool's schema may hold in all
MAX_REF_CHAIN = 200  # $refs followed in a row at one level (deeper: refused, before Python's recursion limit)

_SAME_ONE = ("not", "if", "then", "else")
_SAME_MANY = ("allOf", "anyOf", "oneOf")
_SAME_MAP = ("dependentSchemas",)
_UNEVALUATED = ("unevaluatedProperties", "unevaluatedItems")
_UNBOUNDABLE_REFS = ("$dynamicRef", "$recursiveRef")


class SchemaCostError(ValueError):
    """A schema whose checking cost cannot be bounded, or is past the bound; the message says which."""


def visits_per_value(schema: Any, what: str = "its inputSchema") -> int:
    """The most times jsonschema can visit one value checked against ``schema`` (at least 1).

    Raises:
        SchemaCostError: past :data:`MAX_VISITS_PER_VALUE`, or not boundable (see the module).
    """
    return _Cost(schema, what).worst()


def count_values(value: Any) -> int:
    """How many JSON values ``value`` holds, itself included (iterative: any depth)."""
    count, stack = 0, [value]
    while stack:
        item = stack.pop()
        count += 1
        if isinstance(item, dict):
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return count


def check_call_budget(tool: str, arguments: Any, per_value: int) -> None:
    """Refuse a call whose check could take more than :data:`MAX_CHECK_VISITS` visits.

    Raises:
        ValueError: naming the tool, the count of values and the cap.
    """
    values = count_values(arguments)
    if values * per_value > MAX_CHECK_VISITS:
        raise ValueError(
            f"{tool}(): the arguments hold {values} values and its schema visits each up to {per_value} "
            f"times: checking them could take more than {MAX_CHECK_VISITS} visits (MAX_CHECK_VISITS); "
            "send fewer values"
        )


class _Cost:
    def __init__(self, root: Any, what: str) -> None:
        self.root = root
        self.what = what
        self.nodes: dict[int, Any] = {}  # id -> subschema, for the Counters keyed by id
        self.same: dict[int, Counter[int]] = {}  # memo: the subschemas applied to one value, by count
        self.active: set[int] = set()
        self.worst_at: dict[tuple[int, int], int] = {}  # memo: (id, depth) -> worst visits of one value
        self._count_nodes(root)

    def refuse(self, why: str) -> SchemaCostError:
        return SchemaCostError(f"{self.what} {why}: checking a value against it cannot be bounded")

    def _count_nodes(self, root: Any) -> None:
        seen, stack = 0, [root]
        while stack:
            item = stack.pop()
            if isinstance(item, dict):
                seen += 1
                if item is not root and isinstance(item.get("$id"), str):  # (a property named $id: a dict)
                    raise self.refuse(
                        "has a subschema with its own $id (refs inside it mean another document)"
                    )
                stack.extend(item.values())
            elif isinstance(item, list):
                stack.extend(item)
            if seen > MAX_SCHEMA_NODES:
                raise self.refuse(f"holds more than {MAX_SCHEMA_NODES} subschemas")

    def worst(self) -> int:
        root_id = self._add(self.root)
        worst = 0
        for depth in range(MAX_JSON_DEPTH + 1):
            visits = self.value_visits(root_id, depth)
            if visits == 0:
                break
            worst = max(worst, visits)
        return max(worst, 1)

    def _add(self, node: Any) -> int:
        self.nodes[id(node)] = node
        return id(node)

    def _check(self, visits: int, where: str) -> int:
        if visits > MAX_VISITS_PER_VALUE:
            raise SchemaCostError(
                f"{self.what} visits one value more than {MAX_VISITS_PER_VALUE} times ({where}: nested "
                "anyOf/oneOf/allOf through $ref multiply): checking an argument could take minutes"
            )
        return visits

    # -- one value: every subschema applied to it, with how often ------------------------------------
    def same_level(self, sid: int, chain: int = 0) -> Counter[int]:
        if sid in self.same:
            return self.same[sid]
        if sid in self.active:
            raise self.refuse("has a $ref cycle that never enters the value (its check would never end)")
        if chain > MAX_REF_CHAIN:
            raise self.refuse(f"follows more than {MAX_REF_CHAIN} subschemas in a row at one level")
        node = self.nodes[sid]
        out: Counter[int] = Counter({sid: 1})
        if isinstance(node, dict):
            self.active.add(sid)
            times = 2 if any(k in node for k in _UNEVALUATED) else 1
            for child in self._same_children(node):
                for cid, n in self.same_level(self._add(child), chain + 1).items():
                    out[cid] += n * times
            self.active.discard(sid)
        self._check(sum(out.values()), "at one level")
        self.same[sid] = out
        return out

    def _same_children(self, node: dict[str, Any]) -> list[Any]:
        children: list[Any] = [node[k] for k in _SAME_ONE if isinstance(node.get(k), dict)]
        for key in _SAME_MANY:
            if isinstance(node.get(key), list):
                children += [s for s in node[key] if isinstance(s, dict)]
        for key in (*_SAME_MAP, "dependencies"):
            if isinstance(node.get(key), dict):
                children += [s for s in node[key].values() if isinstance(s, dict)]
        for key in _UNBOUNDABLE_REFS:
            if key in node:
                raise self.refuse(f"uses {key}")
        ref = node.get("$ref")
        if isinstance(ref, str):
            children.append(self._resolve(ref))
        return children

    def _resolve(self, ref: str) -> Any:
        if ref == "#":
            return self.root
        if not ref.startswith("#/"):
            raise self.refuse(f"has a $ref {ref[:100]!r} that is not a local JSON pointer")
        target: Any = self.root
        for part in ref[2:].split("/"):
            key = unquote(part).replace("~1", "/").replace("~0", "~")
            if isinstance(target, dict) and key in target:
                target = target[key]
            elif isinstance(target, list) and key.isdigit() and int(key) < len(target):
                target = target[int(key)]
            else:
                raise self.refuse(f"has a $ref {ref[:100]!r} that leads nowhere")
        if not isinstance(target, dict | bool):
            raise self.refuse(f"has a $ref {ref[:100]!r} that is not a schema")
        return target

    # -- the values inside it -------------------------------------------------------------------
    def value_visits(self, sid: int, depth: int) -> int:
        """The most visits of one value ``depth`` levels inside a value ``sid`` is applied to."""
        key = (sid, depth)
        if key in self.worst_at:
            return self.worst_at[key]
        applied = self.same_level(sid)
        if depth == 0:
            total = sum(applied.values())
        else:
            total = 0
            for tid, n in applied.items():
                node = self.nodes[tid]
                if isinstance(node, dict):
                    total += n * self._child_visits(node, depth - 1)
                    self._check(total, f"{depth} levels in")
        self.worst_at[key] = total
        return total

    def _child_visits(self, node: dict[str, Any], depth: int) -> int:
        """Worst visits of one child value (``depth`` further in) by ``node``'s child keywords: one
        property or one item position at a time, plus what applies to every child."""

        def worst(schemas: list[Any]) -> int:
            return max(
                (self.value_visits(self._add(s), depth) for s in schemas if isinstance(s, dict)), default=0
            )

        def every(schemas: list[Any]) -> int:
            return sum(self.value_visits(self._add(s), depth) for s in schemas if isinstance(s, dict))

        properties = _values(node.get("properties"))
        patterns = _values(node.get("patternProperties"))
        items = node.get("items")
        prefix = _values(node.get("prefixItems"))
        positional = _values(items)
        per_key = worst([*properties, node.get("additionalProperties")])
        per_item = worst([*prefix, *positional, items, node.get("additionalItems")])
        always = every(
            [
                *patterns,
                node.get("contains"),
                node.get("unevaluatedProperties"),
                node.get("unevaluatedItems"),
            ]
        )
        names = every([node.get("propertyNames")]) if depth == 0 else 0  # keys are strings: no depth
        return max(per_key, per_item) + always + names


def _values(holder: Any) -> list[Any]:
    """The subschemas of a keyword holding a map or a list of them (anything else: none)."""
    if isinstance(holder, dict):
        return list(holder.values())
    return list(holder) if isinstance(holder, list) else []
