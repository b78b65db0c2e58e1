"""Serving the UI: the checks made before anything listens, then uvicorn on one socket.

Everything that can fail on the user's input fails before the server starts: a host other than the
loopback interface without a token, a store that does not exist or does not open, a port already taken.
"""

from __future__ import annotations

import asyncio
import ipaddress
import os
import socket
from collections.abc import Callable, Sequence

from ..errors import InvalidArgument
from ..store import Store, open_store, sqlite_file
from .app import LOOPBACK_NAMES, check_files_root, create_app

MIN_TOKEN_CHARS = 16


def is_loopback(host: str) -> bool:
    """Whether ``host`` names this machine's loopback interface (``localhost``, ``127.0.0.0/8``, ``::1``)."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def check_binding(host: str, token: str | None) -> None:
    """Refuse (``InvalidArgument``) an address reachable from other machines without a token, and a token
    too short to stand guessing."""
    if token is not None and len(token) < MIN_TOKEN_CHARS:
        raise InvalidArgument(
            f"the token must be at least {MIN_TOKEN_CHARS} characters; make one with "
            "python3 -c 'import secrets; print(secrets.token_urlsafe(24))'"
        )
    if token is None and not is_loopback(host):
        raise InvalidArgument(
            f"--host {host} can be reached from other machines: pass --token (or $STATEKEEL_UI_TOKEN) so "
            "that every request must carry it, or bind to 127.0.0.1"
        )


async def open_for_reading(
    url: str, encryption_key: bytes | Sequence[bytes] | None = None, audit_key: bytes | None = None
) -> Store:
    """Open the store at ``url`` (with its ``encryption_key``, if encrypted, and its ``audit_key``, if
    its audit chain is keyed) without changing it:
    ``migrate=False``, and a SQLite file that does not exist is an error (opening it would create an empty
    database)."""
    path = sqlite_file(url)
    if path is not None and not await asyncio.to_thread(os.path.exists, path):
        raise InvalidArgument(f"no store at {path}; pass --db with the URL of an existing store")
    return await open_store(url, migrate=False, encryption_key=encryption_key, audit_key=audit_key)


def bind(host: str, port: int) -> socket.socket:
    """A listening TCP socket on ``host``:``port`` (0: a free port). ``OSError`` if it cannot be bound."""
    infos = socket.getaddrinfo(host.strip("[]"), port, type=socket.SOCK_STREAM)
    family, _, _, _, address = infos[0]
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        # Accepted connections inherit it: without it every response after the first on a keep-alive
        # connection waits ~40 ms for the client's delayed ACK (Nagle).
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.bind(address)
        sock.listen(128)
    except BaseException:
        sock.close()
        raise
    return sock


def url_of(sock: socket.socket) -> str:
    host, port = sock.getsockname()[:2]
    return f"http://[{host}]:{port}/" if ":" in host else f"http://{host}:{port}/"


async def serve(
    url: str,
    *,
    host: str = "127.0.0.1",
    port: int = 8765,
    token: str | None = None,
    on_ready: Callable[[str], None] | None = None,
    encryption_key: bytes | Sequence[bytes] | None = None,
    audit_key: bytes | None = None,
    files_root: str | None = None,
) -> None:
    """Open the store read-only (with its ``encryption_key``, for an encrypted store: without it, pages
    that show encrypted values say a key is needed; with its ``audit_key``, the audit chain's MACs are
    checked too), bind, call ``on_ready`` with the address, and serve
    until interrupted. ``files_root``: the directory the file ledger's paths are relative to (the files
    page and the recovery report compare the recorded files with it).

    Raises before serving: ``InvalidArgument`` (binding, token, no such store, a ``files_root`` that is
    not a directory), the store's errors when it
    does not open, ``OSError`` when the address cannot be bound.
    """
    import uvicorn

    check_binding(host, token)
    root = check_files_root(files_root)
    store = await open_for_reading(url, encryption_key, audit_key)
    try:
        sock = bind(host, port)
        # Without a token the Host header must be a loopback name, whatever interface was bound.
        app = create_app(store, token=token, allowed_hosts=None if token else LOOPBACK_NAMES, files_root=root)
        config = uvicorn.Config(
            app,
            lifespan="off",
            access_log=False,  # request lines would put ?token= in the log
            log_level="warning",
            server_header=False,
            proxy_headers=False,
        )
        if on_ready is not None:
            on_ready(url_of(sock))
        try:
            await uvicorn.Server(config).serve(sockets=[sock])
        finally:
            sock.close()
    finally:
        await store.close()


__all__ = ["MIN_TOKEN_CHARS", "bind", "check_binding", "is_loopback", "open_for_reading", "serve"]
