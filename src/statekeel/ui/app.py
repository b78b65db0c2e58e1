"""The ASGI application: routes, the request guard (token, host, methods, security headers), error pages.

Read-only by construction: every route is a GET (HEAD is answered the same way, without a body), the
guard refuses every other method before routing, and pages call only reading methods of the store.
"""

from __future__ import annotations

import contextlib
import hmac
import logging
import os
from collections.abc import AsyncIterator, Callable, Iterable, Sequence
from typing import Any
from urllib.parse import parse_qsl, urlencode

import jinja2
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ..errors import BackendUnavailable, DecryptionError, InvalidArgument, NotFound, StatekeelError
from ..store import Store, open_store, redact_url
from .layout import duration_text
from .page import PageError, Ui
from .pages import routes
from .transcript import compact, pretty

log = logging.getLogger("statekeel.ui")

SAFE_METHODS = frozenset({"GET", "HEAD"})
# No script at all, no external resource, no framing; styles only from the page's own stylesheet.
SECURITY_HEADERS: tuple[tuple[bytes, bytes], ...] = (
    (
        b"content-security-policy",
        b"default-src 'none'; style-src 'self'; img-src 'self'; form-action 'self'; base-uri 'none'; "
        b"frame-ancestors 'none'",
    ),
    (b"x-content-type-options", b"nosniff"),
    (b"x-frame-options", b"DENY"),
    (b"referrer-policy", b"no-referrer"),
    (b"cache-control", b"no-store"),
    (b"cross-origin-resource-policy", b"same-origin"),
    (b"cross-origin-opener-policy", b"same-origin"),
)
LOOPBACK_NAMES = ("127.0.0.1", "localhost", "[::1]")


class Guard:
    """ASGI middleware in front of every request.

    - only GET and HEAD pass (405 otherwise);
    - with a token, the request must carry it (``Authorization: Bearer T`` or ``?token=T``), compared in
      constant time (401 otherwise);
    - without a token, the ``Host`` header must name the loopback interface (403 otherwise): a web page
      that points a name of its own at 127.0.0.1 (DNS rebinding) cannot read the pages;
    - every response carries :data:`SECURITY_HEADERS`.
    """

    def __init__(self, app: ASGIApp, *, token: str | None, allowed_hosts: Iterable[str] | None) -> None:
        self.app = app
        self.token = None if token is None else token.encode("utf-8")
        self.allowed_hosts = None if allowed_hosts is None else frozenset(h.lower() for h in allowed_hosts)

    def _refusal(self, scope: Scope) -> Response | None:
        if scope["method"] not in SAFE_METHODS:
            return PlainTextResponse(
                "405 Method Not Allowed: this page is read-only (GET only)\n",
                status_code=405,
                headers={"Allow": "GET, HEAD"},
            )
        headers = dict(scope["headers"])
        if self.token is not None:
            given: bytes | None = None
            auth = headers.get(b"authorization", b"")
            if auth[:7].lower() == b"bearer ":
                given = auth[7:].strip()
            else:
                # Each byte decoded as one latin-1 character, percent escapes too: encoded back to
                # latin-1, the value is the bytes the client sent — a UTF-8 token's UTF-8 bytes — and no
                # byte sequence (non-ASCII, not UTF-8, a broken escape) can fail to decode.
                query = scope.get("query_string", b"").decode("latin-1")
                for name, value in parse_qsl(query, encoding="latin-1", errors="strict"):
                    if name == "token":
                        given = value.encode("latin-1")
            # compare_digest takes the same time wherever the first difference is; both sides are bytes
            # (the token's UTF-8), so any length or content compares without an error.
            if given is None or not hmac.compare_digest(given, self.token):
                return PlainTextResponse(
                    "401 Unauthorized: this statekeel ui needs its token "
                    "(Authorization: Bearer <token>, or ?token=<token>)\n",
                    status_code=401,
                    headers={"WWW-Authenticate": "Bearer"},
                )
        elif self.allowed_hosts is not None:
            host = headers.get(b"host", b"").decode("latin-1").lower()
            name = host.rsplit(":", 1)[0] if not host.endswith("]") else host
            if name not in self.allowed_hosts:
                return PlainTextResponse(
                    f"403 Forbidden: host {host!r} is not this machine's loopback address; open "
                    "http://127.0.0.1:<port>/ or start statekeel ui with --token\n",
                    status_code=403,
                )
        return None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def send_secured(message: Message) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", []), *SECURITY_HEADERS]
            await send(message)

        refusal = self._refusal(scope)
        if refusal is not None:
            await refusal(scope, receive, send_secured)
            return
        await self.app(scope, receive, send_secured)


def make_templates(token: str | None) -> jinja2.Environment:
    """The template environment: autoescaping on for every template, and ``u(path, **params)`` building
    a link that carries the token when there is one."""
    env = jinja2.Environment(
        loader=jinja2.PackageLoader("statekeel.ui", "templates"),
        autoescape=True,
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )

    def url(path: str, /, **params: Any) -> str:
        query = [(k, str(v)) for k, v in params.items() if v is not None and v != ""]
        if token is not None:
            query.append(("token", token))
        return path + ("?" + urlencode(query) if query else "")

    env.globals["u"] = url
    env.globals["token"] = token
    env.globals["duration"] = duration_text
    env.filters["pretty"] = pretty
    env.filters["compact"] = compact
    return env


def check_files_root(root: str | os.PathLike[str] | None) -> str | None:
    """``root`` as an absolute path, or ``InvalidArgument`` when it is not a directory (None: none)."""
    if root is None:
        return None
    path = os.path.abspath(os.fspath(root))
    if not os.path.isdir(path):
        raise InvalidArgument(
            f"--root {path} is not a directory; pass the directory the file ledger's paths are relative to"
        )
    return path


def _status_of(exc: StatekeelError) -> tuple[int, str]:
    if isinstance(exc, NotFound):
        return 404, "Not found"
    if isinstance(exc, InvalidArgument):
        return 400, "Bad request"
    if isinstance(exc, BackendUnavailable):
        return 503, "Store unavailable"
    return 500, "The store reported an error"


def create_app(
    source: Store | str,
    *,
    token: str | None = None,
    allowed_hosts: Iterable[str] | None = None,
    encryption_key: bytes | Sequence[bytes] | None = None,
    audit_key: bytes | None = None,
    files_root: str | os.PathLike[str] | None = None,
) -> Starlette:
    """The read-only UI over a store.

    ``source`` is an open :class:`~statekeel.Store` (used as is, never closed here) or a URL, opened with
    ``migrate=False`` (and ``encryption_key``, for an encrypted store; ``audit_key``, for a keyed audit
    chain) when the application starts and
    closed when it stops. ``token``: every request must carry it. ``allowed_hosts``: without a token, the
    ``Host`` names accepted (None: any). ``files_root``: the directory the file ledger's paths are
    relative to; the files page and the recovery report compare each recorded file with it
    (``InvalidArgument`` when it is not a directory).

        app = create_app("sqlite:///agent-state.db", allowed_hosts=LOOPBACK_NAMES)
    """
    if token is not None and not token:
        raise InvalidArgument("token must be a non-empty str or None")
    root = check_files_root(files_root)
    if isinstance(source, Store):
        ui = Ui(source, make_templates(token), redact_url(source.url), root)
        lifespan: Callable[[Starlette], contextlib.AbstractAsyncContextManager[None]] | None = None
    else:
        url = source
        ui = Ui(None, make_templates(token), redact_url(url), root)

        @contextlib.asynccontextmanager
        async def lifespan(app: Starlette) -> AsyncIterator[None]:
            # migrate=False: looking at a store never upgrades it under the agents that use it.
            store = await open_store(url, migrate=False, encryption_key=encryption_key, audit_key=audit_key)
            ui.attach(store)
            try:
                yield
            finally:
                ui.attach(None)
                await store.close()

    async def http_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, HTTPException)
        if exc.status_code == 404:
            return ui.error(request, 404, "Not found", f"There is no page at {request.url.path}.")
        return ui.error(request, exc.status_code, "Error", str(exc.detail))

    async def page_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, PageError)
        return ui.error(request, exc.status, exc.title, exc.detail)

    async def store_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, StatekeelError)
        status, title = _status_of(exc)
        if isinstance(exc, DecryptionError) and exc.fields.get("kind") is None:
            # A sealed value met by a store opened without any key (the codec's error).
            detail = (
                "This page shows encrypted values, and the ui was started without the store's key: "
                "start it again with --key-file PATH (or $STATEKEEL_KEY_FILE)."
            )
            return ui.error(request, status, "Encrypted: a key is needed", detail)
        return ui.error(request, status, title, f"{type(exc).__name__}: {exc}")

    async def crash(request: Request, exc: Exception) -> Response:
        log.error("page %s failed", request.url.path, exc_info=exc)
        return ui.error(request, 500, "Internal error", "This page failed; the server's log has the details.")

    app = Starlette(
        routes=routes(ui),
        exception_handlers={
            HTTPException: http_error,
            PageError: page_error,
            StatekeelError: store_error,
            Exception: crash,
        },
        lifespan=lifespan,
    )
    app.add_middleware(Guard, token=token, allowed_hosts=allowed_hosts)
    return app


__all__ = ["LOOPBACK_NAMES", "SECURITY_HEADERS", "Guard", "PageError", "Ui", "check_files_root", "create_app"]
