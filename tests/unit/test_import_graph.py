"""The layering of ``src/statekeel``, read from the imports themselves (parsed with ``ast``, nothing
imported): the store facade's helpers never import it back, the core knows no backend, each record has one
import path, no import cycle exists (an import inside a function counts; only one under ``if
TYPE_CHECKING:`` does not), and no module uses another module's ``_private`` name."""

from __future__ import annotations

import ast
from functools import cache
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src"
PACKAGE = SRC / "statekeel"

# The modules the ``Store`` facade hands its work to: they take what they need as arguments or Protocols.
FACADE_HELPERS = (
    "statekeel.backup",
    "statekeel.copy",
    "statekeel.erasure",
    "statekeel.export",
    "statekeel.health",
    "statekeel.imports",
    "statekeel.recovery",
    "statekeel.retention",
)

# The core: what the managers, the backends and the facade all build on. It knows no backend.
CORE = (
    "statekeel.buffer",
    "statekeel.chain",
    "statekeel.codec",
    "statekeel.codec.aead",
    "statekeel.codec.encryption",
    "statekeel.codec.keyring",
    "statekeel.codec.tagged",
    "statekeel.errors",
    "statekeel.holders",
    "statekeel.journal",
    "statekeel.resealing",
    "statekeel.usage",
    "statekeel.validation",
    "statekeel.wording",
    "statekeel.transcripts",
    "statekeel.transcripts.index",
    "statekeel.transcripts.items",
    "statekeel.transcripts.messages",
    "statekeel.transcripts.window",
)


def _name(path: Path) -> str:
    parts = list(path.relative_to(SRC).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


@cache
def modules() -> dict[str, Path]:
    return {_name(path): path for path in PACKAGE.rglob("*.py")}


def _type_checking_nodes(tree: ast.Module) -> set[int]:
    inside: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            inside.update(id(child) for child in ast.walk(node))
    return inside


def imports_in(source: str, module: str, *, is_package: bool = False, type_checking: bool = True) -> set[str]:
    """The modules the code ``source`` of ``module`` imports, anywhere in it (a function's lazy import
    too); with ``type_checking=False`` leaving out the imports under ``if TYPE_CHECKING:``. ``from pkg
    import sub`` imports the submodule ``pkg.sub``, and the package only when a name is not a submodule."""
    tree = ast.parse(source)
    package = module if is_package else module.rpartition(".")[0]
    skipped = set() if type_checking else _type_checking_nodes(tree)
    found: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            target = _target(node, package)
            subs = [f"{target}.{alias.name}" for alias in node.names if f"{target}.{alias.name}" in modules()]
            found.update(subs)
            if len(subs) < len(node.names):
                found.add(target)
    return {name for name in found if name.startswith("statekeel") and name != module}


def _target(node: ast.ImportFrom, package: str) -> str:
    """The absolute name of the module a ``from ... import`` names."""
    if not node.level:
        return node.module or ""
    base = package.split(".")[: len(package.split(".")) - node.level + 1]
    return ".".join(base + ([node.module] if node.module else []))


@cache
def imports_of(module: str, *, type_checking: bool = True) -> frozenset[str]:
    """The statekeel modules ``module`` imports (see :func:`imports_in`)."""
    path = modules()[module]
    source = path.read_text(encoding="utf-8")
    return frozenset(
        imports_in(source, module, is_package=path.name == "__init__.py", type_checking=type_checking)
    )


def reaches(start: str, goal: str, *, type_checking: bool = True) -> list[str] | None:
    """A chain of imports from ``start`` to ``goal`` (the modules on it), or None."""
    paths = {start: [start]}
    todo = [start]
    while todo:
        here = todo.pop()
        for there in sorted(imports_of(here, type_checking=type_checking)):
            if there == goal:
                return [*paths[here], goal]
            if there in modules() and there not in paths:
                paths[there] = [*paths[here], there]
                todo.append(there)
    return None


def cycles(*, type_checking: bool) -> list[set[str]]:
    """The import cycles of ``src/statekeel``."""
    graph = {m: {i for i in imports_of(m, type_checking=type_checking) if i in modules()} for m in modules()}
    return components(graph)


def components(graph: dict[str, set[str]]) -> list[set[str]]:
    """The strongly connected components of more than one node (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[set[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = set()
            while True:
                w = stack.pop()
                component.add(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(component)

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_the_graph_is_read_from_every_module() -> None:
    assert {"statekeel.store", "statekeel.backends.base", *FACADE_HELPERS, *CORE} <= set(modules())
    assert "statekeel.backup" in imports_of("statekeel.store")
    assert reaches("statekeel.store", "statekeel.backends.base") is not None


def test_the_facade_helpers_never_import_the_store_not_even_for_type_checking() -> None:
    offenders = {m: sorted(imports_of(m) & {"statekeel.store", "statekeel"}) for m in FACADE_HELPERS}
    assert {m: found for m, found in offenders.items() if found} == {}


def test_nothing_the_store_imports_imports_it_back() -> None:
    # TYPE_CHECKING imports count: a helper that names Store in an annotation is in the circle too.
    assert reaches("statekeel.store", "statekeel.store") is None
    for helper in FACADE_HELPERS:
        assert reaches(helper, "statekeel.store") is None, helper


def test_the_core_imports_no_backend() -> None:
    offenders = {
        module: sorted(name for name in imports_of(module) if name.startswith("statekeel.backends"))
        for module in CORE
        if module in modules()
    }
    assert {m: found for m, found in offenders.items() if found} == {}


def test_every_record_is_imported_from_the_contract_and_no_module_mirrors_it() -> None:
    assert not (PACKAGE / "backends" / "records.py").exists()
    importers = sorted(m for m in modules() if "statekeel.backends.records" in imports_of(m))
    assert importers == []


def test_a_cycle_is_found_through_a_functions_lazy_import_but_not_through_type_checking() -> None:
    lazy = "def f():\n    from .b import x\n"
    typed = "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .b import x\n"
    assert imports_in(lazy, "statekeel.a", type_checking=False) == {"statekeel.b"}
    assert imports_in(typed, "statekeel.a", type_checking=False) == set()
    assert imports_in(typed, "statekeel.a") == {"statekeel.b"}
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert components(graph) == [{"a", "b", "c"}]


def test_no_import_cycle_outside_type_checking() -> None:
    found = [sorted(component) for component in cycles(type_checking=False)]
    assert found == [], "import cycles (break them, or make the import type-only under TYPE_CHECKING)"


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def _on_self(node: ast.Attribute) -> bool:
    return isinstance(node.value, ast.Name) and node.value.id in ("self", "cls")


def private_names(source: str) -> set[str]:
    """The ``_private`` names ``source`` defines: its functions, classes, methods, assigned names, the
    attributes it sets on ``self`` or ``cls``, and ``__slots__`` entries."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store) and _on_self(node):
            names.add(node.attr)
        elif isinstance(node, ast.arg):
            names.add(node.arg)
        elif isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "__slots__" for t in node.targets
        ):
            names.update(c.value for c in ast.walk(node.value) if isinstance(c, ast.Constant))
    return {name for name in names if isinstance(name, str) and _private(name)}


# A named tuple's public API is spelt with a leading underscore (so as not to clash with its fields).
NAMED_TUPLE_API = frozenset({"_asdict", "_fields", "_make", "_replace"})


def borrowed_privates(source: str, module: str, everywhere: dict[str, set[str]]) -> list[str]:
    """Where ``source`` (of ``module``) uses a ``_private`` name of another statekeel module: imports it
    (``from .m import _x``), reads it off a module (``m._x``), or off an object (``other._x``, not ``self``
    or ``cls``) when ``_x`` is defined in another module and not in this one. A mixin's ``self._x`` is its
    class's own."""
    own = private_names(source)
    elsewhere = set().union(*(names for name, names in everywhere.items() if name != module)) - own
    elsewhere -= NAMED_TUPLE_API
    found: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and (node.level or (node.module or "").startswith("statekeel")):
            found += [(node.lineno, f"import {a.name}") for a in node.names if _private(a.name)]
        elif (
            isinstance(node, ast.Attribute)
            and _private(node.attr)
            and node.attr in elsewhere
            and not _on_self(node)
        ):
            found.append((node.lineno, ast.unparse(node)))
    return [f"{line}: {use}" for line, use in sorted(found)]


@cache
def _private_names_of_every_module() -> dict[str, set[str]]:
    return {module: private_names(path.read_text(encoding="utf-8")) for module, path in modules().items()}


def test_a_borrowed_private_name_is_found() -> None:
    everywhere = {"statekeel.a": {"_secret", "_held"}, "statekeel.b": set()}
    source = (
        "from .a import _secret\n"
        "from . import a\n"
        "def f(manager, self):\n"
        "    a._secret()\n"
        "    manager._held = 1\n"
        "    self._held\n"
    )
    found = borrowed_privates(source, "statekeel.b", everywhere)
    assert found == ["1: import _secret", "4: a._secret", "5: manager._held"]
    # Set on self, the name is this module's own: another object's is then this module's business too.
    own = "class C:\n    def __init__(self):\n        self._held = 1\n"
    own += "    def f(self, other):\n        other._held\n"
    assert borrowed_privates(own, "statekeel.b", everywhere) == []


def test_no_module_uses_another_modules_private_name() -> None:
    everywhere = _private_names_of_every_module()
    found = {
        module: uses
        for module, path in sorted(modules().items())
        if (uses := borrowed_privates(path.read_text(encoding="utf-8"), module, everywhere))
    }
    assert found == {}, "make a public name instead of reaching into another module's private one"
