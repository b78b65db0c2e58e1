"""A parsed ``postgresql://`` URL: the statekeel options it carries and the parts errors may name.

URL options (``postgresql://user@host:5432/db?pool_max_size=20``): ``pgbouncer=true`` (no prepared
statement cache, no session state: PgBouncer transaction pooling), ``pool_min_size`` (1),
``pool_max_size`` (10), ``connect_timeout`` (10 s), ``failover_timeout`` (how long a call waits for a
primary: 0 s with one host, 10 s with several). ``target_session_attrs`` is checked here and goes to
asyncpg with anything else.

Several hosts (``postgresql://h1:5432,h2:5433/db?target_session_attrs=read-write``): each new connection
tries them in turn and keeps the first one that matches ``target_session_attrs``; that is how the pool
follows the primary across a failover.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from ...errors import InvalidArgument

CONNECT_TIMEOUT_S = 10.0
DEFAULT_MIN_SIZE = 1
DEFAULT_MAX_SIZE = 10
# How long a call waits (retrying with backoff) for a primary when the URL names several hosts.
FAILOVER_TIMEOUT_S = 10.0

# libpq's values, which asyncpg follows. The first three may land on a standby: such a store reads only.
SESSION_ATTRS = ("any", "primary", "read-write", "standby", "prefer-standby", "read-only")
READ_ONLY_ATTRS = frozenset({"standby", "prefer-standby", "read-only"})


class PgTarget:
    """A parsed PostgreSQL URL: the statekeel options it carries, and the parts errors may name.

    Options in the query string, removed before the URL reaches asyncpg: ``pgbouncer=true`` (no prepared
    statement cache, no session state: PgBouncer transaction pooling), ``pool_min_size``,
    ``pool_max_size``, ``connect_timeout`` and ``failover_timeout`` (seconds). ``target_session_attrs`` is
    validated and passed on. Errors name host(s), port and database, never the password.
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
        self.connect_timeout = _float_param(params, "connect_timeout", CONNECT_TIMEOUT_S, low=None)
        attrs = params.get("target_session_attrs", "any")
        if attrs not in SESSION_ATTRS:
            raise InvalidArgument(
                f"target_session_attrs must be one of {', '.join(SESSION_ATTRS)} in a postgresql:// URL, "
                f"got {attrs!r}"
            )
        self.session_attrs = attrs
        self.read_only = attrs in READ_ONLY_ATTRS
        hostspec = parts.netloc.rpartition("@")[2]
        socket_dir = params.get("host", "")
        if socket_dir and "," not in socket_dir:  # ``?host=/run/postgresql``: the URL's port, if any
            self.hosts = [(socket_dir, _hosts(hostspec)[0][1] if hostspec else 5432)]
        else:
            self.hosts = _hosts(socket_dir or hostspec)
        if len(self.hosts) == 1:
            self.host = self.hosts[0][0]
            self.port: int | None = self.hosts[0][1]
        else:  # several hosts: asyncpg tries them in turn
            self.host, self.port = ",".join(f"{h}:{p}" for h, p in self.hosts), None
        self.failover_timeout = _float_param(
            params, "failover_timeout", FAILOVER_TIMEOUT_S if len(self.hosts) > 1 else 0.0, low=0.0
        )
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

    @property
    def host_list(self) -> str:
        """The hosts, ``h1:p1, h2:p2``, for messages."""
        return ", ".join(f"{h}:{p}" for h, p in self.hosts)

    def __str__(self) -> str:
        where = self.host if self.port is None else f"{self.host}:{self.port}"
        return f"postgresql://{where}/{self.database}"


def _hosts(spec: str) -> list[tuple[str, int]]:
    """``h1:p1,h2,[::1]:p3`` → ``[(h1, p1), (h2, 5432), (::1, p3)]``; a bad port is ``InvalidArgument``."""
    hosts: list[tuple[str, int]] = []
    for item in spec.split(","):
        item = item.strip()
        if item.startswith("["):  # [IPv6]:port
            host, _, rest = item[1:].partition("]")
            port_text = rest[1:] if rest.startswith(":") else ""
        elif item.count(":") == 1:
            host, _, port_text = item.partition(":")
        else:
            host, port_text = item, ""
        if not port_text:
            port = 5432
        elif port_text.isascii() and port_text.isdigit() and 0 < int(port_text) < 65536:
            port = int(port_text)
        else:
            raise InvalidArgument(f"the port in postgresql://{spec}/… is not a number (1-65535)")
        hosts.append((host or "localhost", port))
    return hosts


def _float_param(params: dict[str, str], name: str, default: float, *, low: float | None) -> float:
    # ``low`` None: the value must be > 0; else >= low.
    raw = params.pop(name, None)
    if raw is None:
        return default
    try:
        value = float(raw)
    except ValueError:
        value = float("nan")
    ok = (value > 0 if low is None else value >= low) and value <= 3600
    if not ok:
        interval = "(0, 3600]" if low is None else f"[{low:g}, 3600]"
        raise InvalidArgument(f"{name} must be a number of seconds in {interval}, got {raw!r}")
    return value


def _int_param(params: dict[str, str], name: str, default: int, *, minimum: int) -> int:
    raw = params.pop(name, None)
    if raw is None:
        return default
    if not (raw.isascii() and raw.isdigit()) or int(raw) < minimum or int(raw) > 10_000:
        raise InvalidArgument(f"{name} must be an integer in [{minimum}, 10000] in the URL, got {raw!r}")
    return int(raw)
