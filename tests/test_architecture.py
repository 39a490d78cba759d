"""The package's shape: no import cycles, a small root, imports at the top.

import-linter checks the layers in ``make lint`` (pyproject.toml); this
test checks what it does not: no cycle among the package's modules, with
imports inside functions counted too; no import of the package's own
modules inside a function except the few that must wait for Django's app
registry; the root holds only the app's conventional modules.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import kumiflow_django

PACKAGE = Path(kumiflow_django.__file__).parent
ROOT = "kumiflow_django"

#: Modules that import the package's own modules inside a function, and why.
LATE_IMPORTS = {
    # Django's convention: ready() imports what needs the app registry.
    "kumiflow_django.apps",
    # Test modules import it before Django is set up; the loops import models.
    "kumiflow_django.testing",
}

#: What may sit at the root of the package (besides subpackages).
#: (``routers``: Django's name for a module of database routers, named in settings.)
ROOT_MODULES = {"__init__", "apps", "checks", "conf", "routers", "signals", "testing"}


def modules() -> dict[str, Path]:
    found = {}
    for path in PACKAGE.rglob("*.py"):
        relative = path.relative_to(PACKAGE.parent).with_suffix("")
        if "migrations" in relative.parts:
            continue
        name = ".".join(relative.parts).removesuffix(".__init__")
        found[name] = path
    return found


def _type_checking_lines(tree: ast.AST) -> set[int]:
    lines: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for child in node.body:
                for inner in ast.walk(child):
                    if hasattr(inner, "lineno"):
                        lines.add(inner.lineno)
    return lines


def imports(name: str, path: Path, known: dict[str, Path]) -> Iterator[tuple[str, bool]]:
    """The package modules ``name`` imports, each with whether inside a function."""
    tree = ast.parse(path.read_text())
    skip = _type_checking_lines(tree)
    in_function: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            for inner in ast.walk(node):
                if isinstance(inner, ast.Import | ast.ImportFrom):
                    in_function.add(inner.lineno)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(tree):
        if not isinstance(node, ast.Import | ast.ImportFrom) or node.lineno in skip:
            continue
        late = node.lineno in in_function
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        else:
            base = node.module or ""
            if node.level:
                parent = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                base = f"{parent}.{base}" if base else parent
            targets = [
                f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base
                for alias in node.names
            ]
        for target in targets:
            if target in known and target != ROOT:
                yield target, late


def test_no_import_cycles_among_the_package_modules():
    known = modules()
    graph = {name: {t for t, _ in imports(name, path, known)} for name, path in known.items()}
    cycles = _cycles(graph)
    assert cycles == [], "import cycles: " + "; ".join(" -> ".join(c) for c in cycles)


def test_the_package_imports_its_own_modules_at_the_top():
    known = modules()
    late = {
        name for name, path in known.items() for _, inside in imports(name, path, known) if inside
    }
    assert late <= LATE_IMPORTS, f"imports inside functions: {sorted(late - LATE_IMPORTS)}"


def test_the_root_holds_only_the_apps_conventional_modules():
    root = {p.stem for p in PACKAGE.glob("*.py")}
    assert root <= ROOT_MODULES, f"unexpected modules at the root: {sorted(root - ROOT_MODULES)}"
    assert len(root) <= 10


def test_the_cycle_finder_finds_a_cycle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in sorted(graph.get(node, ())):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1 or node in graph.get(node, ()):
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


#: The one module that asks which database it is (its capabilities: ``db.supports_listen()``, ...).
VENDOR_SEAM = "kumiflow_django.store.db"


def vendor_comparisons(source: str) -> list[int]:
    """Lines of ``source`` that compare a database's vendor (``vendor ==``,
    ``in``, ``!=``, either side, however it is reached)."""
    lines = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Compare):
            operands = [node.left, *node.comparators]
        elif isinstance(node, ast.Match):
            operands = [node.subject]
        else:
            continue
        if any("vendor" in ast.unparse(operand) for operand in operands):
            lines.append(node.lineno)
    return lines


def test_only_the_database_seam_asks_which_database_it_is():
    """Everywhere else asks store/db.py for a capability by its name, so that
    what a check means is written once (and a new database is one module's work)."""
    offenders = [
        f"{name}:{line}"
        for name, path in sorted(modules().items())
        if name != VENDOR_SEAM
        for line in vendor_comparisons(path.read_text())
    ]
    assert offenders == []


def test_the_vendor_check_finds_comparisons():
    source = (
        "if connection.vendor == 'sqlite': pass\n"
        "x = 'mysql' != connections[a].vendor\n"
        "y = vendor in ('postgresql',)\n"
        "z = SQL.get(connection.vendor)\n"  # a lookup, not a comparison
        "match db.connection().vendor:\n    case 'sqlite': pass\n"
    )
    assert sorted(vendor_comparisons(source)) == [1, 2, 3, 5]


def test_no_module_reaches_into_djangos_on_commit_list():
    """``connection.run_on_commit`` is Django's private list: notifications are
    batched by store.wakeups.notify through the public ``transaction.on_commit``."""
    offenders = [
        f"{name}:{node.lineno}"
        for name, path in sorted(modules().items())
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Attribute) and node.attr == "run_on_commit"
    ]
    assert offenders == []
