"""One tool: a host-side Python function, how it is described, and how a call to it is checked.

A tool is a plain function, a callable object, or a LangChain tool (recognised by shape, since LangChain
is not a dependency: ``.name`` and ``.description`` strings and a ``.func``, ``._run`` or ``.invoke``).
The model and the program see it as its Python signature, annotations exactly as written, followed by
the first line of its docstring.

Calls arrive from a model-written program as JSON arguments. :meth:`Tool.bind` checks them against the
signature with the very ``TypeError`` Python itself would raise, so the program sees the error it would
see calling a local function.
"""

from __future__ import annotations

import builtins
import functools
import inspect
import keyword
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar

from sandfleet.core.errors import ToolLoadError

SIDE_EFFECTS_ATTR = "__sandfleet_side_effects__"
MAX_TOOL_NAME_CHARS = 100
# Parameters LangChain injects into ``_run``; the program never passes them.
_LANGCHAIN_INJECTED = ("run_manager", "callbacks", "config")


class ToolWarning(UserWarning):
    """A tool loads but is likely to confuse the model (no docstring, a name that shadows a builtin)."""


def side_effects(func: Any) -> Any:
    """Mark a tool as changing the world (sending mail, writing records).

    The engine uses the mark to avoid repeating such calls silently when it repairs a program.
    Works on functions and on LangChain tool objects (the mark then goes on their ``func``).
    """
    try:
        setattr(func, SIDE_EFFECTS_ATTR, True)
    except (AttributeError, TypeError, ValueError):  # a frozen or pydantic object: mark what it wraps
        setattr(func.func, SIDE_EFFECTS_ATTR, True)
    return func


@dataclass(frozen=True)
class Tool:
    """A loaded tool. ``func`` takes the arguments the program passes, exactly as ``signature`` shows."""

    name: str
    func: Callable[..., Any]
    signature: str
    description: str
    side_effects: bool
    module: str = ""  # where it came from: a module spec, or ``mcp:SERVER`` for an MCP server's tool

    # Whether ``call`` bounds itself by the ``timeout_s`` it is given (an MCP request is cancelled).
    # A plain function cannot be stopped: the bridge runs it on a thread and stops waiting instead.
    stops_at_timeout: ClassVar[bool] = False
    # Whether the tool only reads (an MCP server's resource reader): approval patterns never gate it.
    read_only: ClassVar[bool] = False

    @classmethod
    def from_object(cls, obj: Any, *, name: str | None = None, module: str = "") -> Tool:
        """Make a tool of a function, callable object or LangChain-shaped tool.

        Args:
            obj: the tool.
            name: the name the program calls it by; by default the function's or LangChain tool's name.
            module: where it came from, for error messages.

        Raises:
            ToolLoadError: not callable, a class, async, no readable signature, or a name that is not
                a Python identifier.
        """
        where = f" in {module}" if module else ""
        if _is_langchain_shaped(obj):
            func, sig, doc = _adapt_langchain(obj, where)
            name = name or str(obj.name)
            marked = getattr(obj, SIDE_EFFECTS_ATTR, False) or getattr(func, SIDE_EFFECTS_ATTR, False)
        else:
            func, doc = obj, _docstring(obj)
            name = name or str(getattr(obj, "__name__", ""))
            sig = _signature(obj, name, where)
            marked = getattr(obj, SIDE_EFFECTS_ATTR, False)
        _check_name(name, where)
        if inspect.iscoroutinefunction(func) or inspect.iscoroutinefunction(type(func).__call__):
            raise ToolLoadError(f"tool {name}{where} is async; tools must be plain (synchronous) functions")
        description = _first_line(doc)
        if not description:
            warnings.warn(
                f"tool {name}{where} has no docstring; the model will see only its signature",
                ToolWarning,
                stacklevel=2,
            )
        if hasattr(builtins, name):
            message = f"tool {name}{where} shadows the Python builtin {name!r} in the program"
            warnings.warn(message, ToolWarning, stacklevel=2)
        return cls(name, func, _render(name, sig, module), description, bool(marked), module)

    def describe(self) -> str:
        """The signature, then the description indented on the next line (what the model sees)."""
        return f"{self.signature}\n    {self.description}" if self.description else self.signature

    def bind(self, args: list[Any], kwargs: dict[str, Any]) -> inspect.BoundArguments:
        """Check a call's arguments against the signature.

        Raises:
            TypeError: the message Python gives for the same call, e.g.
                "get_order() missing 1 required positional argument: 'order_id'".
        """
        self._checker(*args, **kwargs)
        return self._parameters.bind(*args, **kwargs)

    def call(self, args: list[Any], kwargs: dict[str, Any], timeout_s: float | None = None) -> Any:
        """Bind, then call the function; its exceptions propagate unchanged. ``timeout_s`` is for
        tools that stop themselves (``stops_at_timeout``); a plain function ignores it."""
        bound = self.bind(args, kwargs)
        return self.func(*bound.args, **bound.kwargs)

    def parameters(self) -> inspect.Signature | None:
        """The signature calls are bound to (None when Python cannot read one): it names positional
        arguments, for redaction."""
        try:
            return self._parameters
        except (TypeError, ValueError):
            return None

    @functools.cached_property
    def _parameters(self) -> inspect.Signature:
        return _call_signature(self.func)

    @functools.cached_property
    def _checker(self) -> Callable[..., None]:
        return _make_checker(self.name, self._parameters)


def _is_langchain_shaped(obj: Any) -> bool:
    if inspect.isroutine(obj) or inspect.isclass(obj):
        return False
    if not all(isinstance(getattr(obj, attr, None), str) for attr in ("name", "description")):
        return False
    return any(callable(getattr(obj, attr, None)) for attr in ("func", "_run", "invoke"))


def _adapt_langchain(obj: Any, where: str) -> tuple[Callable[..., Any], inspect.Signature, str]:
    """The plain function behind a LangChain tool, its signature and its description."""
    func = getattr(obj, "func", None)
    if callable(func):  # StructuredTool / @tool: the decorated function itself
        return func, _signature(func, obj.name, where), obj.description
    if func is None and getattr(obj, "coroutine", None) is not None:
        raise ToolLoadError(f"tool {obj.name}{where} is async-only; tools must be synchronous")
    run = getattr(obj, "_run", None)
    if callable(run):  # a BaseTool subclass: _run minus the parameters LangChain injects
        full = _signature(run, obj.name, where)
        kept = [p for p in full.parameters.values() if p.name not in _LANGCHAIN_INJECTED]
        injected = {p.name: None for p in full.parameters.values() if p.name in _LANGCHAIN_INJECTED}

        def run_tool(*args: Any, **kwargs: Any) -> Any:
            return run(*args, **kwargs, **injected)

        sig = full.replace(parameters=kept)
        run_tool.__signature__ = sig  # type: ignore[attr-defined]
        return run_tool, sig, obj.description
    invoke_tool, sig = _adapt_invoke(obj, where)
    return invoke_tool, sig, obj.description


def _adapt_invoke(obj: Any, where: str) -> tuple[Callable[..., Any], inspect.Signature]:
    """A tool with only ``.invoke(input)``: keyword arguments from its ``args_schema`` fields (pydantic v2)
    become the input dict; without a schema it takes one ``tool_input``."""
    fields = getattr(getattr(obj, "args_schema", None), "model_fields", None)
    empty = inspect.Parameter.empty
    try:
        if fields:
            params = [
                inspect.Parameter(
                    field_name,
                    inspect.Parameter.KEYWORD_ONLY,
                    default=empty if field.is_required() else field.get_default(call_default_factory=True),
                    annotation=empty if field.annotation is None else field.annotation,
                )
                for field_name, field in fields.items()
            ]
        else:
            params = [inspect.Parameter("tool_input", inspect.Parameter.POSITIONAL_OR_KEYWORD)]
    except ValueError as e:  # a field name that is not a valid parameter name
        raise ToolLoadError(f"tool {obj.name}{where} has an unusable args_schema: {e}") from e
    sig = inspect.Signature(params)

    def invoke_tool(*args: Any, **kwargs: Any) -> Any:
        bound = sig.bind(*args, **kwargs)
        return obj.invoke(dict(bound.arguments) if fields else bound.arguments["tool_input"])

    invoke_tool.__signature__ = sig  # type: ignore[attr-defined]
    return invoke_tool, sig


def _signature(func: Any, name: str, where: str) -> inspect.Signature:
    if inspect.isclass(func):
        raise ToolLoadError(f"{name}{where} is a class; a tool is a function (or a LangChain tool)")
    if not callable(func):
        raise ToolLoadError(f"{name}{where} is a {type(func).__name__}, not a callable tool")
    try:
        return inspect.signature(func)  # annotations stay as written: strings are not evaluated
    except (TypeError, ValueError) as e:
        raise ToolLoadError(f"cannot read the signature of tool {name}{where}: {e}") from e


def _call_signature(func: Callable[..., Any]) -> inspect.Signature:
    """The signature without annotations and return type: what binding needs."""
    sig = inspect.signature(func)
    params = [p.replace(annotation=inspect.Parameter.empty) for p in sig.parameters.values()]
    return sig.replace(parameters=params, return_annotation=inspect.Signature.empty)


def _docstring(obj: Any) -> str:
    if isinstance(obj, functools.partial):
        obj = obj.func
    return inspect.getdoc(obj) or ""


def _first_line(doc: str | None) -> str:
    return next((line.strip() for line in (doc or "").splitlines() if line.strip()), "")


def is_tool_name(name: str) -> bool:
    """Whether ``name`` can name a tool: an ASCII Python identifier, not a keyword, not too long."""
    return (
        name.isidentifier()
        and name.isascii()
        and len(name) <= MAX_TOOL_NAME_CHARS
        and not keyword.iskeyword(name)
    )


def _check_name(name: str, where: str) -> None:
    if not is_tool_name(name):
        raise ToolLoadError(
            f"tool name {name!r}{where} is not a Python identifier; the program calls tools as functions"
        )


class _Text:
    """An annotation or default rendered as given text (inspect otherwise quotes string annotations)."""

    def __init__(self, text: str) -> None:
        self.text = text

    def __repr__(self) -> str:
        return self.text


def _annotation_text(annotation: Any, module: str) -> Any:
    if annotation is inspect.Parameter.empty:
        return annotation
    if isinstance(annotation, str):
        return _Text(annotation)
    return _Text(inspect.formatannotation(annotation, base_module=module or None))


def _render(name: str, sig: inspect.Signature, module: str) -> str:
    """``name(param: type = default, ...) -> type`` with annotations as written in the source."""
    params = [p.replace(annotation=_annotation_text(p.annotation, module)) for p in sig.parameters.values()]
    returns = _annotation_text(sig.return_annotation, module)
    return f"{name}{sig.replace(parameters=params, return_annotation=returns)}"


def _make_checker(name: str, sig: inspect.Signature) -> Callable[..., None]:
    """A do-nothing function with the same parameters, named ``name``: calling it raises Python's own
    TypeError for a bad call. Only parameter names (identifiers) reach the source; defaults stay objects."""
    defaults: list[Any] = []
    params = []
    for param in sig.parameters.values():
        if param.default is not inspect.Parameter.empty:
            params.append(param.replace(default=_Text(f"_defaults[{len(defaults)}]")))
            defaults.append(param.default)
        else:
            params.append(param)
    namespace: dict[str, Any] = {"_defaults": defaults}
    exec(f"def _check{sig.replace(parameters=params)}:\n    pass", namespace)
    checker = namespace["_check"]
    checker.__name__ = checker.__qualname__ = name
    return checker
