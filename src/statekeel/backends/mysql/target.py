"""A parsed ``mysql://`` / ``mariadb://`` URL: the statekeel options it carries and the parts errors may name.

``mysql://user:password@host:3306/database?pool_max_size=20``. Options in the query string:
``pool_min_size`` (1), ``pool_max_size`` (10), ``connect_timeout`` (10 s), ``unix_socket`` (a socket path
instead of TCP). Errors name host, port and database, never the password.
"""

from __future__ import annotations

import re
from typing import Any
from urllib.parse import parse_qsl, unquote, urlsplit

from ...errors import InvalidArgument

CONNECT_TIMEOUT_S = 10.0
DEFAULT_MIN_SIZE = 1
DEFAULT_MAX_SIZE = 10
SCHEMES = ("mysql", "mariadb")
_DATABASE = re.compile(r"^[A-Za-z0-9_$]{1,64}$")


class MyTarget:
    """A parsed MySQL/MariaDB URL."""

    def __init__(self, url: str) -> None:
        if not isinstance(url, str):
            raise InvalidArgument(f"store URL must be a str, got {type(url).__name__}")
        parts = urlsplit(url)
        if parts.scheme not in SCHEMES:
            raise InvalidArgument(f"not a MySQL/MariaDB URL (scheme {parts.scheme!r}); use mysql://…")
        self.scheme = parts.scheme
        params = dict(parse_qsl(parts.query, keep_blank_values=True))
        self.password = unquote(parts.password) if parts.password else params.pop("password", "") or ""
        self._secrets = [s for s in (parts.password, self.password) if s]
        self.user = unquote(parts.username) if parts.username else "root"
        try:
            self.host = parts.hostname or "localhost"
            self.port = parts.port or 3306
        except ValueError:
            raise InvalidArgument(
                f"the port in {parts.scheme}://{parts.netloc.rpartition('@')[2]}/… is not a number (1-65535)"
            ) from None
        self.database = (parts.path or "/").lstrip("/")
        if not _DATABASE.match(self.database):
            raise InvalidArgument(
                f"a {parts.scheme}:// URL names its database after the host (mysql://user@host/agents); got "
                f"{self.database!r} (letters, digits, '_' and '$', at most 64)"
            )
        self.unix_socket = params.pop("unix_socket", None)
        self.min_size = _int_param(params, "pool_min_size", DEFAULT_MIN_SIZE, minimum=0)
        self.max_size = _int_param(params, "pool_max_size", DEFAULT_MAX_SIZE, minimum=1)
        if self.min_size > self.max_size:
            raise InvalidArgument(
                f"pool_min_size {self.min_size} is larger than pool_max_size {self.max_size}",
                pool_min_size=self.min_size,
                pool_max_size=self.max_size,
            )
        raw_timeout = params.pop("connect_timeout", None)
        self.connect_timeout = CONNECT_TIMEOUT_S
        if raw_timeout is not None:
            try:
                self.connect_timeout = float(raw_timeout)
            except ValueError:
                self.connect_timeout = -1.0
            if not 0 < self.connect_timeout <= 3600:
                raise InvalidArgument(
                    f"connect_timeout must be a number of seconds in (0, 3600], got {raw_timeout!r}"
                )
        if params:
            raise InvalidArgument(
                f"unknown option(s) {sorted(params)} in a {parts.scheme}:// URL; known: pool_min_size, "
                "pool_max_size, connect_timeout, unix_socket, password"
            )

    def connect_kwargs(self) -> dict[str, Any]:
        kwargs: dict[str, Any] = {
            "host": self.host,
            "port": self.port,
            "user": self.user,
            "password": self.password,
            "db": self.database,
            "connect_timeout": self.connect_timeout,
        }
        if self.unix_socket:
            kwargs["unix_socket"] = self.unix_socket
        return kwargs

    @property
    def fields(self) -> dict[str, Any]:
        """The error fields naming this server: host, port and database."""
        return {"host": self.host, "port": self.port, "database": self.database}

    def scrub(self, text: str) -> str:
        """``text`` with the URL's password (if any) blanked out."""
        for secret in self._secrets:
            text = text.replace(secret, "***")
        return text

    def __str__(self) -> str:
        return f"{self.scheme}://{self.host}:{self.port}/{self.database}"


def _int_param(params: dict[str, str], name: str, default: int, *, minimum: int) -> int:
    raw = params.pop(name, None)
    if raw is None:
        return default
    if not (raw.isascii() and raw.isdigit()) or int(raw) < minimum or int(raw) > 10_000:
        raise InvalidArgument(f"{name} must be an integer in [{minimum}, 10000] in the URL, got {raw!r}")
    return int(raw)
