"""The definition fingerprint: a SHA-256 over the canonical form of a workflow.

Functions enter it by their source, parsed and unparsed (so reformatting or
a comment does not change it, an edit does), plus the primitive values they
close over or read from module globals (so changing a constant they use
changes it too). The code object is the fallback where no source exists;
that fallback is specific to the Python version.
"""

from __future__ import annotations

import ast
import functools
import hashlib
import json
import linecache
import types
from collections.abc import Callable, Mapping
from typing import Any

_PRIMITIVES = (str, int, float, bool, type(None))


def fingerprint(canonical: Mapping[str, Any]) -> str:
    text = json.dumps(canonical, sort_keys=True, separators=(",", ":"), default=_default)
    return hashlib.sha256(text.encode()).hexdigest()


def _default(value: Any) -> Any:
    if callable(value):
        return {"callable": callable_digest(value)}
    if isinstance(value, set | frozenset | tuple):
        return sorted(map(repr, value)) if isinstance(value, set | frozenset) else list(value)
    return repr(value)


def callable_digest(fn: Callable[..., Any]) -> str:
    """A stable text for a function: its normalised source and primitive bindings."""
    if isinstance(fn, functools.partial):
        return f"partial({callable_digest(fn.func)},{fn.args!r},{sorted(fn.keywords.items())!r})"
    code = getattr(fn, "__code__", None)
    if not isinstance(code, types.CodeType):
        target = getattr(fn, "__qualname__", None) or type(fn).__qualname__
        return f"{getattr(fn, '__module__', '?')}.{target}"
    source = _source(fn, code)
    return f"{source}|{_bindings(fn, code)}"


def _source(fn: Callable[..., Any], code: types.CodeType) -> str:
    node = _find_node(code)
    if node is not None:
        return ast.unparse(node)
    # No source (a REPL, a generated function): the code object's content.
    return f"code:{code.co_code.hex()}:{_consts(code)}:{code.co_names}"


def _consts(code: types.CodeType) -> str:
    parts = []
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            parts.append(f"<{const.co_code.hex()}:{_consts(const)}>")
        else:
            parts.append(repr(const))
    return ",".join(parts)


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


def _bindings(fn: Callable[..., Any], code: types.CodeType) -> str:
    bound: dict[str, Any] = {}
    closure = getattr(fn, "__closure__", None) or ()
    for name, cell in zip(code.co_freevars, closure, strict=False):
        try:
            value = cell.cell_contents
        except ValueError:  # an empty cell
            continue
        bound[name] = _binding_value(value)
    module_globals = getattr(fn, "__globals__", {})
    for name in code.co_names:
        if name in module_globals:
            value = module_globals[name]
            if isinstance(value, _PRIMITIVES):
                bound[name] = value
    return json.dumps(bound, sort_keys=True, default=repr)


def _binding_value(value: Any) -> Any:
    if isinstance(value, _PRIMITIVES):
        return value
    if callable(value) and hasattr(value, "__code__"):
        return callable_digest(value)
    return type(value).__qualname__
