"""The layering of ``src/statekeel``, read from the imports themselves (parsed with ``ast``, nothing
imported): the store facade's helpers never import it back, the core knows no backend, each record has one
import path, and no new import cycle appears."""

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

# Cycles that exist on purpose (outside TYPE_CHECKING), each as the modules it may hold. Any other
# cycle, or one of these reaching a module outside its set, fails the test.
KNOWN_CYCLES: dict[str, tuple[str, ...]] = {
    # create_app imports the pages when it builds its routes.
    "the viewer's app and its pages": ("statekeel.ui",),
}


def _known(component: set[str]) -> bool:
    return any(
        all(any(m == p or m.startswith(p + ".") for p in members) for m in component)
        for members in KNOWN_CYCLES.values()
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


@cache
def imports_of(module: str, *, type_checking: bool = True) -> frozenset[str]:
    """The statekeel modules ``module`` imports, anywhere in it (a function's lazy import too); with
    ``type_checking=False`` leaving out the imports under ``if TYPE_CHECKING:``. ``from pkg import sub``
    imports the submodule ``pkg.sub``, and the package only when a name is not a submodule."""
    path = modules()[module]
    tree = ast.parse(path.read_text(encoding="utf-8"))
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    skipped = set() if type_checking else _type_checking_nodes(tree)
    found: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            subs = [f"{target}.{alias.name}" for alias in node.names if f"{target}.{alias.name}" in modules()]
            found.update(subs)
            if len(subs) < len(node.names):
                found.add(target)
    return frozenset(name for name in found if name.startswith("statekeel") and name != module)


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
    """The strongly connected components of more than one module (Tarjan)."""
    graph = {m: {i for i in imports_of(m, type_checking=type_checking) if i in modules()} for m in modules()}
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


def test_no_import_cycle_but_the_known_ones() -> None:
    unexplained = [sorted(component) for component in cycles(type_checking=False) if not _known(component)]
    assert unexplained == []
