"""The API reference, generated from the docstrings: ``python tools/api_reference.py > docs/api/index.md``.

It documents every name of ``statekeel.__all__``: its signature and docstring, and for a class its own
public methods and fields. Docstrings and signatures are read with pdoc's documentation model (a dev
dependency); the Markdown is written here, in a fixed order, without anything that changes between runs
(memory addresses of default values are removed), so that a test can regenerate the page and compare.
"""

from __future__ import annotations

import re
import sys
from typing import Any

import pdoc.doc

import statekeel

INTRO = """# API reference

Every public name of `statekeel` (`statekeel.__all__`), in the order the package exports them: its
signature and docstring, and for a class its own public methods and fields. The narrative guides are
the other pages of docs/ (concepts.md first).

This page is generated from the docstrings with [pdoc](https://pdoc.dev)'s documentation model, written
as Markdown so that it reads on any Git host and diffs in review: `python tools/api_reference.py >
docs/api/index.md`. pdoc rather than mkdocstrings: it needs no site configuration nor theme, reads
the signatures and docstrings as Python sees them (re-exported names included), and is one dev
dependency; a test regenerates this page and fails when it is stale or a public name has no docstring.
"""

_BAR = "\\|"  # a | inside a Markdown table cell
_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+")


def _clean(text: str) -> str:
    return _ADDRESS.sub("", text)


def _docstring(doc: pdoc.doc.Doc[Any]) -> str:
    return _clean(doc.docstring.strip())


def _signature(doc: pdoc.doc.Function | pdoc.doc.Class) -> str:
    if isinstance(doc, pdoc.doc.Class):
        init = doc.members.get("__init__")
        if not isinstance(init, pdoc.doc.Function):
            return ""
        doc = init
    try:
        return _clean(str(doc.signature_without_self))
    except (ValueError, TypeError):
        return "(...)"


def _function(name: str, doc: pdoc.doc.Function, level: str) -> list[str]:
    prefix = "async " if doc.funcdef == "async def" else ""
    out = [f"{level} `{name}`\n", "```python", f"{prefix}def {name}{_signature(doc)}", "```\n"]
    text = _docstring(doc)
    if text:
        out.append(text + "\n")
    return out


def _fields(doc: pdoc.doc.Class) -> list[str]:
    rows = []
    for member in doc.own_members:
        if isinstance(member, pdoc.doc.Variable) and not member.name.startswith("_"):
            annotation = (_clean(member.annotation_str.lstrip(": ").strip()) or " ").replace("|", _BAR)
            text = " ".join(_docstring(member).split()).replace("|", _BAR)
            rows.append(f"| `{member.name}` | `{annotation}` | {text} |")
    if not rows:
        return []
    return ["| field | type | |", "|---|---|---|", *rows, ""]


def _class(name: str, doc: pdoc.doc.Class) -> list[str]:
    out = [f"## `{name}`\n", "```python", f"class {name}{_signature(doc)}", "```\n"]
    text = _docstring(doc)
    if text:
        out.append(text + "\n")
    out += _fields(doc)
    for member in doc.own_members:
        if isinstance(member, pdoc.doc.Function) and not member.name.startswith("_"):
            out += _function(f"{name}.{member.name}", member, "###")
    return out


def documented(module: pdoc.doc.Module, name: str) -> tuple[str, pdoc.doc.Doc[Any] | None]:
    """What documents public ``name``: (the name it is documented under, its pdoc object). An alias of a
    class (``Task = TaskRecord``) is documented by the class."""
    doc = module.get(name)
    value = getattr(statekeel, name)
    if isinstance(doc, pdoc.doc.Variable) and isinstance(value, type):
        target = pdoc.doc.Module.from_name(value.__module__).get(value.__qualname__)
        return value.__qualname__, target
    return name, doc


def missing_docstrings() -> list[str]:
    """The public names (and public methods of public classes) without a docstring."""
    module = pdoc.doc.Module(statekeel)
    missing = []
    for name in statekeel.__all__:
        _, doc = documented(module, name)
        if doc is None or not doc.docstring.strip():
            missing.append(name)
            continue
        if isinstance(doc, pdoc.doc.Class):
            for member in doc.own_members:
                public = isinstance(member, pdoc.doc.Function) and not member.name.startswith("_")
                if public and not member.docstring.strip():
                    missing.append(f"{name}.{member.name}")
    return missing


def render() -> str:
    """The whole reference page, as Markdown."""
    module = pdoc.doc.Module(statekeel)
    parts = [INTRO, "## Contents\n"]
    parts += [f"- [`{name}`](#{name.lower()})" for name in statekeel.__all__]
    parts.append("")
    for name in statekeel.__all__:
        target, doc = documented(module, name)
        if target != name:
            parts += [f"## `{name}`\n", f"`{name}` is [`{target}`](#{target.lower()}), as stored.\n"]
            if target in statekeel.__all__:
                continue
            assert isinstance(doc, pdoc.doc.Class)
            parts += [line.replace(f"## `{target}`", f"### `{target}`", 1) for line in _class(target, doc)]
        elif isinstance(doc, pdoc.doc.Class):
            parts += _class(name, doc)
        elif isinstance(doc, pdoc.doc.Function):
            parts += _function(name, doc, "##")
        elif doc is not None:
            parts += [f"## `{name}`\n", _docstring(doc) + "\n"]
    return "\n".join(parts).rstrip() + "\n"


if __name__ == "__main__":
    sys.stdout.write(render())
