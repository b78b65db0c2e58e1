"""A parsed ``postgresql://`` URL: the statekeel options it carries and the parts errors may name.

URL options (``postgresql://user@host:5432/db?pool_max_size=20``): ``pgbouncer=true`` (no prepared
statement cache, no session state: PgBouncer transaction pooling), ``pool_min_size`` (1),
``pool_max_size`` (10), ``connect_timeout`` (10 s). Anything else goes to asyncpg.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from ...errors import InvalidArgument

CONNECT_TIMEOUT_S = 10.0
DEFAULT_MIN_SIZE = 1
DEFAULT_MAX_SIZE = 10


class PgTarget:
    """A parsed PostgreSQL URL: the statekeel options it carries, and the parts errors may name.

    Options in the query string, removed before the URL reaches asyncpg: ``pgbouncer=true`` (no prepared
    statement cache, no session state: PgBouncer transaction pooling), ``pool_min_size``,
    ``pool_max_size``, ``connect_timeout`` (seconds). Errors name host, port and database, never the
    password.
    """

    def __init__(self, url: str) -> None:
        if not isinstance(url, str):
            raise InvalidArgument(f"store URL must be a str, got {type(url).__name__}")
        parts = urlsplit(url)
        if parts.scheme not in ("postgresql", "postgres"):
            raise InvalidArgument(f"not a PostgreSQL URL (scheme {parts.scheme!r}); use postgresql://…")
        params = dict(parse_qsl(parts.query, keep_blank_values=True))
        # asyncpg also takes the password from the query string (``?password=…``).
        self._secrets = [s for s in (parts.password, params.get("password")) if s]
        flag = params.pop("pgbouncer", "false").lower()
        if flag not in ("true", "false", "1", "0"):
            raise InvalidArgument(f"pgbouncer must be true or false in a postgresql:// URL, got {flag!r}")
        self.pgbouncer = flag in ("true", "1")
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
        hostspec = parts.netloc.rpartition("@")[2]
        try:
            self.host = params.get("host") or parts.hostname or "localhost"
            self.port: int | None = parts.port or 5432
        except ValueError:
            if "," not in hostspec:  # a port that is not a number
                raise InvalidArgument(
                    f"the port in postgresql://{hostspec}/… is not a number (1-65535)"
                ) from None
            self.host, self.port = hostspec, None  # several hosts: asyncpg tries them in turn
        self.database = (parts.path or "/").lstrip("/") or (parts.username or "postgres")
        self.dsn = urlunsplit((parts.scheme, parts.netloc, parts.path, urlencode(params), ""))

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
        where = self.host if self.port is None else f"{self.host}:{self.port}"
        return f"postgresql://{where}/{self.database}"


def _int_param(params: dict[str, str], name: str, default: int, *, minimum: int) -> int:
    raw = params.pop(name, None)
    if raw is None:
        return default
    if not (raw.isascii() and raw.isdigit()) or int(raw) < minimum or int(raw) > 10_000:
        raise InvalidArgument(f"{name} must be an integer in [{minimum}, 10000] in the URL, got {raw!r}")
    return int(raw)
