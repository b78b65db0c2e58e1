"""What every page of the viewer shares: :class:`Ui` (the store, the templates, the rendering of a page
and of an error page) and :class:`PageError`. The pages import it; it imports no page and not the
application."""

from __future__ import annotations

from typing import Any

import jinja2
from starlette.requests import Request
from starlette.responses import HTMLResponse

from ..errors import BackendUnavailable
from ..store import Store


class PageError(Exception):
    """Ends a page with an error page of ``status`` (404 for an unknown id, 400 for a bad parameter)."""

    def __init__(self, status: int, title: str, detail: str) -> None:
        super().__init__(detail)
        self.status = status
        self.title = title
        self.detail = detail


class Ui:
    """What the pages share: the store, the templates, the store's URL (password blanked) and the
    directory the file ledger's paths are relative to (None: not given)."""

    def __init__(
        self, store: Store | None, templates: jinja2.Environment, url: str, files_root: str | None = None
    ) -> None:
        self._store = store
        self.templates = templates
        self.url = url
        self.files_root = files_root

    def attach(self, store: Store | None) -> None:
        """Serve ``store`` (None: the application stopped and closed it)."""
        self._store = store

    @property
    def store(self) -> Store:
        if self._store is None:
            raise BackendUnavailable("the store is not open (the application's lifespan has not started)")
        return self._store

    def render(
        self, request: Request, template: str, /, *, status_code: int = 200, **context: Any
    ) -> HTMLResponse:
        page = self.templates.get_template(template)
        context.setdefault("section", request.url.path)
        html = page.render(store_url=self.url, path=request.url.path, **context)
        return HTMLResponse(html, status_code=status_code)

    def error(self, request: Request, status: int, title: str, detail: str) -> HTMLResponse:
        return self.render(request, "error.html", status_code=status, title=title, detail=detail)


__all__ = ["PageError", "Ui"]
