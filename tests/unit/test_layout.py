"""The source tree's layout rules, read from the syntax trees of src/ (never from its text).

- No file under src/ is over 700 lines.
- A session's bookkeeping belongs to ``sessions/session.py``: no other module reads or writes a
  ``Session`` attribute or method whose name starts with ``_`` (the rest of the package goes through
  ``SessionBook``).
- A session's writes flow one way: ``sessions/writes.py``, ``sessions/fallback.py`` and
  ``sessions/tools.py`` never import the manager (not even for type checking).
- Nothing outside ``sessions/`` reaches into the session manager's private members (``store.sessions._x``):
  the adapters and recovery use its public methods.
- The folders show the architecture: the task modules are the package ``tasks/`` (the step journal, the
  operator's operations and their shared rules never import the manager, except for type checking); the
  codec, the cipher and the key ring are the package ``codec/``, with one direction between them (codec
  -> cipher -> key ring -> AEAD helpers, the codec naming the cipher only for type checking).
"""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src"
PACKAGE = SRC / "statekeel"
SESSIONS = PACKAGE / "sessions"
MAX_LINES = 700
MANAGER = "statekeel.sessions.manager"


def _sources() -> list[Path]:
    return sorted(SRC.rglob("*.py"))


def _tree(path: Path) -> ast.Module:
    return ast.parse(path.read_text(encoding="utf-8"), filename=str(path))


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def _session_private_names() -> set[str]:
    """The private attributes (``__slots__``) and methods of class ``Session`` in sessions/session.py."""
    tree = _tree(SESSIONS / "session.py")
    (cls,) = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Session"]
    names: set[str] = set()
    for node in cls.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and _private(node.name):
            names.add(node.name)
        elif isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "__slots__" for t in node.targets
        ):
            for element in ast.walk(node.value):
                is_name = isinstance(element, ast.Constant) and isinstance(element.value, str)
                if is_name and _private(element.value):
                    names.add(element.value)
    return names


def _names_a_session(node: ast.expr) -> bool:
    """Whether ``node`` is a name or attribute that names one session (``session``, ``cached_session``,
    ``self.session``), not the manager (``store.sessions``)."""
    name = node.id if isinstance(node, ast.Name) else node.attr if isinstance(node, ast.Attribute) else ""
    return "session" in name.lower() and not name.lower().endswith("sessions")


def _session_private_uses(path: Path, private: set[str]) -> list[str]:
    """``x._name`` in ``path`` where ``_name`` is a private member of Session and ``x`` is not ``self``
    or ``cls``, or where ``x`` names a session."""
    found = []
    for node in ast.walk(_tree(path)):
        if not isinstance(node, ast.Attribute) or not _private(node.attr):
            continue
        owner = node.value
        on_self = isinstance(owner, ast.Name) and owner.id in ("self", "cls")
        if (node.attr in private and not on_self) or _names_a_session(owner):
            found.append(f"{path.relative_to(SRC)}:{node.lineno}: .{node.attr}")
    return found


def _imported_modules(path: Path, *, type_checking: bool = True) -> set[str]:
    """The absolute names of the modules ``path`` imports (relative imports resolved); with
    ``type_checking=False`` leaving out those under ``if TYPE_CHECKING:``."""
    package = ".".join(path.relative_to(SRC).with_suffix("").parts[:-1])
    tree = _tree(path)
    skipped: set[int] = set()
    if not type_checking:
        for node in ast.walk(tree):
            if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
                skipped.update(id(child) for child in ast.walk(node))
    names = set()
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                module = ".".join([*base, node.module] if node.module else base)
            else:
                module = node.module or ""
            names.add(module)
            names.update(f"{module}.{alias.name}" for alias in node.names)
    return names


def test_no_file_under_src_is_over_700_lines() -> None:
    over = {
        str(path.relative_to(SRC)): lines
        for path in _sources()
        if (lines := len(path.read_text(encoding="utf-8").splitlines())) > MAX_LINES
    }
    assert not over, f"files over {MAX_LINES} lines: {over}"


def test_the_private_members_of_session_are_found() -> None:
    private = _session_private_names()
    # The check below means something only if it knows Session's bookkeeping.
    assert {"_head", "_saving", "_fallback_sig", "_changes"} <= private


def test_no_module_outside_session_py_touches_a_private_member_of_a_session() -> None:
    private = _session_private_names()
    found = [
        use
        for path in _sources()
        if path != SESSIONS / "session.py"
        for use in _session_private_uses(path, private)
    ]
    assert not found, "private members of Session used outside sessions/session.py:\n" + "\n".join(found)


def test_the_session_writes_fallback_and_tool_calls_do_not_import_the_manager() -> None:
    names = ("writes.py", "fallback.py", "tools.py")
    missing = [name for name in names if not (SESSIONS / name).is_file()]
    assert not missing, f"sessions/ has no {missing}: a session's writes have one owner, sessions/writes.py"
    importing = {
        name: found
        for name in names
        if (found := sorted(m for m in _imported_modules(SESSIONS / name) if m.startswith(MANAGER)))
    }
    assert not importing, f"modules importing {MANAGER}: {importing}"


def test_the_import_check_resolves_relative_imports() -> None:
    modules = _imported_modules(SESSIONS / "manager.py")
    assert "statekeel.sessions.session" in modules
    assert "statekeel.backends.base" in modules


def _manager_private_uses(path: Path) -> list[str]:
    """``<x>.sessions._name`` in ``path``: a private member of the session manager, reached from outside."""
    found = []
    for node in ast.walk(_tree(path)):
        if not isinstance(node, ast.Attribute) or not _private(node.attr):
            continue
        owner = node.value
        if isinstance(owner, ast.Attribute) and owner.attr == "sessions":
            found.append(f"{path.relative_to(SRC)}:{node.lineno}: .sessions.{node.attr}")
    return found


def test_no_module_outside_sessions_reaches_into_the_session_managers_privates() -> None:
    found = [
        use for path in _sources() if SESSIONS not in path.parents for use in _manager_private_uses(path)
    ]
    assert not found, "private members of SessionManager used outside sessions/:\n" + "\n".join(found)


TASKS = PACKAGE / "tasks"
CODEC = PACKAGE / "codec"


def _imports_within(path: Path, package: str, *, type_checking: bool) -> set[str]:
    """The modules of ``package`` that ``path`` imports, by their names inside it (``pkg.mod.name`` is
    module ``mod``)."""
    found = _imported_modules(path, type_checking=type_checking)
    names = {name.removeprefix(package + ".") for name in found if name.startswith(package + ".")}
    return {name.split(".")[0] for name in names}


def test_the_task_modules_are_one_package_whose_helpers_never_import_the_manager() -> None:
    assert not [p.name for p in PACKAGE.glob("task*.py")], "the task modules belong in tasks/"
    assert {p.name for p in TASKS.glob("*.py")} >= {"__init__.py", "manager.py", "steps.py", "operations.py"}
    for name in ("rules.py", "steps.py", "operations.py"):
        assert "manager" not in _imports_within(TASKS / name, "statekeel.tasks", type_checking=False), name
    assert _imports_within(TASKS / "rules.py", "statekeel.tasks", type_checking=True) == set()


def test_the_codec_the_cipher_and_the_key_ring_are_one_package_with_one_direction() -> None:
    for name in ("codec.py", "encryption.py", "keyring.py"):
        assert not (PACKAGE / name).exists(), f"{name} belongs in codec/"
    below = {
        "aead.py": set(),
        "keyring.py": {"aead"},
        "encryption.py": {"aead", "keyring"},
        "tagged.py": set(),  # the cipher only under TYPE_CHECKING
    }
    found = {name: _imports_within(CODEC / name, "statekeel.codec", type_checking=False) for name in below}
    assert found == below
