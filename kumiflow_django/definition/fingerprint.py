"""The definition fingerprint: a SHA-256 over the canonical form of a workflow.

The canonical form must read the same in every process, or a run started by
one process fails with ``workflow_definition_changed`` when another resumes
it. So it renders only values whose text is stable: JSON-like data, classes
(by dotted path), enums (by class path and value), dates, durations,
decimals, UUIDs, dataclass instances (by their fields), Django's ``Q`` and
expressions (by their deconstruction), and functions. Anything else (an
``object()``, an instance whose repr holds a memory address) is refused
when the workflow is defined (:class:`UnstableValue`), never rendered by
``repr``.

Functions enter it by their source, parsed and unparsed (so reformatting or
a comment does not change it, an edit does), plus the primitive values they
close over, take as defaults or read from module globals (so changing a
constant they use changes it too); any other bound value enters by its type
name. The code object is the fallback where no source exists; that fallback
is specific to the Python version.
"""

from __future__ import annotations

import ast
import dataclasses
import datetime as dt
import decimal
import enum
import functools
import hashlib
import json
import linecache
import re
import types
import uuid
from collections.abc import Callable, Mapping
from typing import Any

from django.db.models import Q

_PRIMITIVES = (str, int, float, bool, type(None))
#: Types whose repr CPython defines from their value alone.
_VALUE_TYPES = (dt.timedelta, dt.date, dt.time, decimal.Decimal, uuid.UUID, bytes)
#: ``<object object at 0x7f…>``, ``<function f at 0x…>``: text that changes per process.
_ADDRESS = re.compile(r"\bat 0x[0-9a-fA-F]+")

Render = Callable[[Any, str], Any]


class UnstableValue(TypeError):
    """A value the fingerprint cannot render the same way in every process."""

    def __init__(self, where: str, value: Any, reason: str) -> None:
        self.where, self.value, self.reason = where, value, reason
        text = _short_repr(value)
        super().__init__(f"{where}: {text} {reason}" if where else f"{text} {reason}")


def fingerprint(canonical: Mapping[str, Any]) -> str:
    text = json.dumps(canonical, sort_keys=True, separators=(",", ":"), default=_default)
    return hashlib.sha256(text.encode()).hexdigest()


def _default(value: Any) -> Any:
    return canonical_value(value)


def canonical_value(value: Any, where: str = "", render: Render | None = None) -> Any:
    """``value`` as JSON data that reads the same in every process.

    ``render`` renders the values nested in containers (the definition passes
    its own, which also knows steps). Raises :class:`UnstableValue` for a
    value without such a form.
    """
    nested = render or canonical_value
    if isinstance(value, enum.Enum):  # before str/int: StrEnum and IntEnum are both
        return {"enum": _dotted(type(value)), "value": nested(value.value, f"{where}.value")}
    if isinstance(value, _PRIMITIVES):
        return value
    if isinstance(value, type):
        return _dotted(value)
    if isinstance(value, Q) or _is_deconstructible(value):
        path, args, kwargs = value.deconstruct()
        return {
            "deconstruct": path,
            "args": [nested(a, f"{where}[{i}]") for i, a in enumerate(args)],
            "kwargs": {k: nested(v, f"{where}[{k!r}]") for k, v in sorted(kwargs.items())},
        }
    if callable(value):
        return {"callable": callable_digest(value, where)}
    if isinstance(value, Mapping):
        rendered: dict[str, Any] = {}
        for key, item in value.items():
            if not isinstance(key, _PRIMITIVES) or isinstance(key, enum.Enum):
                raise UnstableValue(
                    f"{where} (a key)", key, "is not a key the fingerprint can render: use strings"
                )
            rendered[str(key)] = nested(item, f"{where}[{key!r}]")
        return rendered
    if isinstance(value, list | tuple):
        return [nested(item, f"{where}[{i}]") for i, item in enumerate(value)]
    if isinstance(value, set | frozenset):
        items = [nested(item, f"{where}{{…}}") for item in value]
        return sorted(items, key=lambda item: json.dumps(item, sort_keys=True))
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        fields = {f.name: getattr(value, f.name) for f in dataclasses.fields(value)}
        return {
            "dataclass": _dotted(type(value)),
            "fields": {k: nested(v, f"{where}.{k}") for k, v in fields.items()},
        }
    text = _repr(value)
    if _ADDRESS.search(text):  # object.__repr__ too: ``<… object at 0x…>``
        raise UnstableValue(where, value, _ADDRESS_REASON)
    if isinstance(value, _VALUE_TYPES):
        return text  # defined by the value (a datetime's includes its tzinfo's)
    raise UnstableValue(
        where,
        value,
        f"(a {type(value).__qualname__}) is not a value the fingerprint can render the same "
        "way in every process; " + _HINT,
    )


_HINT = (
    "use JSON-like data, a class, an enum, a date or duration, or a function of the context "
    "that builds the object"
)
_ADDRESS_REASON = (
    "has no stable text: its repr holds a memory address, so every process would compute "
    "another fingerprint and no other process could resume the run; " + _HINT
)


def _repr(value: Any) -> str:
    try:
        return repr(value)
    except Exception:  # a broken __repr__ must not hide the real error
        return f"<{type(value).__qualname__} with a failing repr>"


def _short_repr(value: Any) -> str:
    text = _repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _dotted(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def _is_deconstructible(value: Any) -> bool:
    """Django's ``@deconstructible`` objects (``F``, expressions, validators)."""
    return hasattr(value, "_constructor_args") and callable(getattr(value, "deconstruct", None))


def callable_digest(fn: Callable[..., Any], where: str = "") -> str:
    """A stable text for a function: its normalised source and its bindings."""
    return _digest(fn, where, frozenset())


def _digest(fn: Callable[..., Any], where: str, active: frozenset[types.CodeType]) -> str:
    if isinstance(fn, functools.partial):
        args = canonical_value(list(fn.args), f"{where} (a partial's arguments)")
        keywords = canonical_value(dict(fn.keywords), f"{where} (a partial's keywords)")
        text = json.dumps([args, keywords], sort_keys=True, separators=(",", ":"))
        return f"partial({_digest(fn.func, where, active)},{text})"
    code = getattr(fn, "__code__", None)
    if not isinstance(code, types.CodeType):
        # A builtin, a method of a builtin type, a callable instance: its name.
        target = getattr(fn, "__qualname__", None) or type(fn).__qualname__
        return f"{getattr(fn, '__module__', '?')}.{target}"
    if code in active:  # a function that refers to itself through its closure
        return f"recursive:{code.co_qualname}"
    source = _source(fn, code)
    return f"{source}|{_bindings(fn, code, active | {code})}"


def _source(fn: Callable[..., Any], code: types.CodeType) -> str:
    node = _find_node(code)
    if node is not None:
        return ast.unparse(node)
    # No source (a REPL, a generated function): the code object's content.
    return f"code:{code.co_code.hex()}:{_consts(code)}:{code.co_names}"


def _consts(code: types.CodeType) -> str:
    return ",".join(_const_text(const) for const in code.co_consts)


def _const_text(const: Any) -> str:
    if isinstance(const, types.CodeType):
        return f"<{const.co_code.hex()}:{_consts(const)}>"
    if isinstance(const, frozenset):  # ``x in {"a", "b"}``: its repr follows the hash seed
        return "frozenset({" + ", ".join(sorted(map(_const_text, const))) + "})"
    if isinstance(const, tuple):
        parts = [_const_text(c) for c in const]
        return "(" + ", ".join(parts) + ("," if len(parts) == 1 else "") + ")"
    return repr(const)


@functools.cache
def _module_tree(filename: str) -> ast.Module | None:
    lines = linecache.getlines(filename)
    if not lines:
        return None
    try:
        return ast.parse("".join(lines))
    except SyntaxError:
        return None


def _find_node(code: types.CodeType) -> ast.AST | None:
    tree = _module_tree(code.co_filename)
    if tree is None:
        return None
    line = code.co_firstlineno
    if code.co_name == "<lambda>":
        candidates: list[ast.AST] = [
            n for n in ast.walk(tree) if isinstance(n, ast.Lambda) and n.lineno == line
        ]
        if len(candidates) > 1:
            # Several lambdas on one line: pick the one whose body holds the
            # first positioned instruction of this code object.
            spots = [(p[0], p[2]) for p in code.co_positions() if p[0] and p[2] is not None]
            body_spot = next((s for s in spots if s != (line, 0)), None)
            if body_spot is not None:
                candidates = [
                    n
                    for n in candidates
                    if isinstance(n, ast.Lambda) and _contains(n.body, body_spot)
                ] or candidates[:1]
        return candidates[0] if len(candidates) == 1 else None
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
            and node.name == code.co_name
            and (node.lineno == line or any(d.lineno == line for d in node.decorator_list))
        ):
            return node
    return None


def _contains(node: ast.expr, spot: tuple[int, int]) -> bool:
    start = (node.lineno, node.col_offset)
    end = (node.end_lineno or node.lineno, node.end_col_offset or 0)
    return start <= spot <= end


def _bindings(
    fn: Callable[..., Any], code: types.CodeType, active: frozenset[types.CodeType]
) -> str:
    bound: dict[str, Any] = {}
    closure = getattr(fn, "__closure__", None) or ()
    for name, cell in zip(code.co_freevars, closure, strict=False):
        try:
            value = cell.cell_contents
        except ValueError:  # an empty cell
            continue
        bound[name] = _binding_value(value, active)
    module_globals = getattr(fn, "__globals__", {})
    for name in code.co_names:
        if name in module_globals:
            value = module_globals[name]
            if isinstance(value, _PRIMITIVES):
                bound[name] = value
    # ``lambda ctx, limit=LIMIT: …`` binds a value like a closure does. The
    # keys are no identifiers, so they cannot clash with a variable's name.
    defaults = getattr(fn, "__defaults__", None)
    if defaults:
        bound["<defaults>"] = [_binding_value(v, active) for v in defaults]
    kwdefaults = getattr(fn, "__kwdefaults__", None)
    if kwdefaults:
        bound["<kwdefaults>"] = {k: _binding_value(v, active) for k, v in kwdefaults.items()}
    return json.dumps(bound, sort_keys=True)


def _binding_value(value: Any, active: frozenset[types.CodeType]) -> Any:
    """A bound value: a primitive as itself, a function by its digest, anything
    else by its type's name (stable, though blind to the object's state)."""
    if isinstance(value, _PRIMITIVES):
        return value
    if callable(value) and hasattr(value, "__code__"):
        return _digest(value, "", active)
    return type(value).__qualname__
