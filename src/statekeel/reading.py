"""Opening a store to look at it: the one opener of the ``statekeel`` commands and of the viewer
(``statekeel ui``), with one set of texts for a store that cannot be opened.

    store = await open_for_reading("sqlite:///agent-state.db")

The store is opened with ``migrate=False``: a store that agents of another version share is never
upgraded by looking at it (a pending migration raises ``MigrationError``, a newer schema
``SchemaTooNew``). A ``sqlite:///`` file that does not exist is an error, not a new empty database, and a
URL that names no store (an unknown scheme, ``memory://``, a PostgreSQL URL without a host) is refused
before anything connects. Both are ``InvalidArgument``, with the message the command line and the viewer
show as they are.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Sequence
from urllib.parse import urlsplit

from .errors import InvalidArgument, StatekeelError
from .retention import Retention
from .store import Store, open_store, redact_url, sqlite_file, sqlite_path

URL_FORMS = (
    "sqlite:///file.db, sqlite:////abs/path.db, postgresql://user@host:5432/db, "
    "mariadb://user@host:3306/db or nats://host:4222?rest=sqlite:///state.db"
)
"""The store URLs the messages name."""


def check_url(url: str, what: str = "--db") -> None:
    """``InvalidArgument`` for a URL that does not parse or that names no store one can look at (an
    unknown scheme; ``memory://``, which would open a new, empty store); ``what`` names where the URL
    came from in the message. Nothing connects."""
    shown = redact_url(url)
    try:
        parts = urlsplit(url)
        scheme = parts.scheme
        if scheme == "sqlite":
            sqlite_path(url)
        elif scheme in ("postgresql", "postgres", "mysql", "mariadb", "nats"):
            _parse_server_url(url, what, shown)
        elif scheme == "memory":
            raise InvalidArgument(
                f"{what} memory:// would open a new, empty store that ends with the command; pass the URL "
                f"of an existing store: {URL_FORMS}",
                hint="",
            )
        else:
            reason = f"unknown store URL scheme {scheme!r}" if scheme else "it has no scheme"
            raise InvalidArgument(
                f"{what} {shown!r} is not a store URL ({reason}); use {URL_FORMS}", url=shown, hint=""
            )
    except InvalidArgument as exc:
        if exc.message.startswith(what):
            raise
        raise InvalidArgument(f"{what}: {exc.message}", hint="") from None
    except ValueError as exc:
        raise InvalidArgument(f"{what} {shown!r} does not parse: {exc}", hint="") from None


def _parse_server_url(url: str, what: str, shown: str) -> None:
    """Parse a PostgreSQL, MariaDB or NATS URL with the parser its backend opens it with (several
    hosts with ports, ``h1:5432,h2:5432``, included), and refuse one that names no server."""
    from .backends.mysql.target import SCHEMES as MY_SCHEMES
    from .backends.mysql.target import MyTarget
    from .backends.nats.url import parse_nats_url
    from .backends.postgres.target import PgTarget

    parts = urlsplit(url)
    rest: str | None = None
    try:
        if parts.scheme in MY_SCHEMES:
            MyTarget(url)
        elif parts.scheme == "nats":
            rest = parse_nats_url(url).rest
        else:
            PgTarget(url)
    except InvalidArgument as exc:
        raise InvalidArgument(f"{what} {shown!r} does not parse: {exc.message}", hint="") from None
    server = parts.netloc.rpartition("@")[2]
    if parts.scheme == "nats":
        if rest is not None and urlsplit(rest).scheme != "memory":
            check_url(rest, f"{what} rest=")  # the paired SQL store's URL, parsed as its own
    elif parts.scheme in MY_SCHEMES:
        if not server or not parts.path.strip("/"):
            raise InvalidArgument(
                f"{what} {shown}: a MariaDB URL needs a host and a database: mariadb://user@host:3306/db",
                hint="",
            )
    elif not server and "host=" not in parts.query:
        raise InvalidArgument(
            f"{what} {shown}: a PostgreSQL URL needs a host: postgresql://user@host/db", hint=""
        )


def require_existing(url: str) -> None:
    """``InvalidArgument`` when ``url`` names a SQLite file that does not exist: opening would create it."""
    path = sqlite_file(url)
    if path is not None and not os.path.exists(path):
        raise InvalidArgument(
            f"no store at {path}: the file does not exist (nothing was created); pass --db URL or set "
            "$STATEKEEL_URL",
            path=path,
            hint="",
        )


async def open_for_reading(
    url: str,
    *,
    encryption_key: bytes | Sequence[bytes] | None = None,
    audit_key: bytes | None = None,
    retention: Retention | None = None,
    encrypt_existing: bool = False,
    keyring: str | os.PathLike[str] | None = None,
) -> Store:
    """Open the existing store at ``url`` without changing its schema (see the module documentation),
    with its ``encryption_key`` if it is encrypted and its ``audit_key`` if its audit chain is keyed
    (``retention`` and ``encrypt_existing`` as for :func:`statekeel.open_store`, for the commands that
    purge or re-encrypt it; ``keyring``, the file of per-subject data keys, as for ``open_store``).
    Raises ``InvalidArgument`` (see :func:`check_url`, :func:`require_existing`)
    before anything connects, and the store's own errors when it does not open."""
    check_url(url)
    await asyncio.to_thread(require_existing, url)
    return await open_store(
        url,
        migrate=False,
        retention=retention,
        encryption_key=encryption_key,
        encrypt_existing=encrypt_existing,
        audit_key=audit_key,
        keyring=keyring,
    )


def error_text(exc: StatekeelError) -> str:
    """How the command line and the viewer show an error met opening a store: the message of an
    ``InvalidArgument`` (it says what was wrong and what to do), else the error's type and its text."""
    return str(exc) if isinstance(exc, InvalidArgument) else f"{type(exc).__name__}: {exc}"


__all__ = ["URL_FORMS", "check_url", "error_text", "open_for_reading", "require_existing"]
