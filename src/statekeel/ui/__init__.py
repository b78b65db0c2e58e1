"""``statekeel ui``: a read-only web page to look at a store — what an agent said, did and is doing.

Needs the ``ui`` extra (``pip install 'statekeel[ui]'``: Starlette, uvicorn, Jinja2). Pages are rendered on
the server, escape everything they show, and only read: see ``docs/ui.md``.

    app = create_app("sqlite:///agent-state.db")       # an ASGI application (opened with migrate=False)
    await serve("sqlite:///agent-state.db", host="127.0.0.1", port=8765)
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .app import LOOPBACK_NAMES, create_app
    from .server import serve


def __getattr__(name: str) -> Any:
    # Imported on first use: statekeel.ui.transcript and statekeel.ui.layout (used by the command-line
    # views too) need none of the ui extra's packages.
    if name in ("LOOPBACK_NAMES", "create_app"):
        from . import app

        return getattr(app, name)
    if name == "serve":
        from .server import serve

        return serve
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["LOOPBACK_NAMES", "create_app", "serve"]
