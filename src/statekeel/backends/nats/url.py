"""``nats://`` URLs: the servers, the stream prefix, and the SQL store paired with them (``rest=``).

This module does not import nats-py: the store opener and the fallback directory read URLs without it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from ...errors import InvalidArgument

__all__ = ["PAIRABLE_KINDS", "PAIRED_KINDS", "NatsUrl", "paired_url", "parse_nats_url"]

PAIRABLE_KINDS = {
    "sessions": frozenset({"sessions", "tool_calls"}),
    "audit": frozenset({"audit"}),
    "traces": frozenset({"traces"}),
}
"""The names ``kinds=`` takes, and the state kinds each puts on NATS (a session's tool-call journal is
part of its event log, so it goes with the session)."""

PAIRED_KINDS = frozenset().union(*PAIRABLE_KINDS.values())
"""The kinds a paired store (``rest=``) keeps on NATS when its URL names no ``kinds=``: sessions with
their tool calls, the audit chain and traces; everything else is the SQL store's."""

_PREFIX = re.compile(r"^[A-Za-z0-9_-]{1,32}$")


@dataclass(frozen=True, slots=True)
class NatsUrl:
    """A parsed ``nats://`` URL: the servers, the name prefix of the streams, their replicas, the request
    timeout, and the SQL URL paired with it (``rest=``; None for a plain NATS store). ``kinds`` is what a
    paired store keeps on NATS (``kinds=sessions,audit,traces``, any of them; :data:`PAIRED_KINDS` when
    the URL names none), as state kinds."""

    servers: tuple[str, ...]
    prefix: str
    replicas: int
    timeout: float
    rest: str | None
    kinds: frozenset[str] = PAIRED_KINDS


def parse_nats_url(url: str) -> NatsUrl:
    """Parse ``nats://host:4222[,host2:4222…][?prefix=P&replicas=N&timeout=S&kinds=K,…][&rest=SQL-URL]``.

    ``rest=`` must come last: everything after it, ``?`` and ``&`` included, is the SQL URL, verbatim.
    """
    scheme, sep, remainder = url.partition("://")
    if not sep or scheme != "nats":
        raise InvalidArgument(f"not a NATS URL: {url!r}; use nats://host:4222", url=url)
    location, _, query = remainder.partition("?")
    rest: str | None = None
    params: dict[str, str] = {}
    if query:
        head, marker, tail = (
            ("", "rest=", query[5:]) if query.startswith("rest=") else query.partition("&rest=")
        )
        if marker:
            if not tail:
                raise InvalidArgument(f"rest= names no SQL URL in {url!r}", url=url)
            rest = tail
        for item in filter(None, head.split("&")):
            name, eq, value = item.partition("=")
            if not eq or name not in ("prefix", "replicas", "timeout", "kinds"):
                raise InvalidArgument(
                    f"unknown NATS URL option {item!r} in {url!r}; known: prefix=, replicas=, timeout=, "
                    "kinds=, rest= (last)",
                    url=url,
                )
            if name in params:
                raise InvalidArgument(f"NATS URL option {name}= given twice in {url!r}", url=url)
            params[name] = value
    hosts = location.rstrip("/")
    if "/" in hosts:
        raise InvalidArgument(f"a NATS URL has no path: {url!r}; use nats://host:4222", url=url)
    auth, at, hostlist = hosts.rpartition("@")
    if not hostlist:
        raise InvalidArgument(f"NATS URL {url!r} names no server; use nats://host:4222", url=url)
    servers = tuple(f"nats://{auth}{at}{h}" for h in hostlist.split(",") if h)
    prefix = params.get("prefix", "statekeel")
    if not _PREFIX.match(prefix):
        raise InvalidArgument(
            f"prefix={prefix!r} in {url!r} is not a stream name prefix: use 1 to 32 of A-Z a-z 0-9 _ -",
            url=url,
        )
    try:
        replicas = int(params.get("replicas", "1"))
        timeout = float(params.get("timeout", "5"))
    except ValueError:
        raise InvalidArgument(f"replicas= must be an integer and timeout= a number in {url!r}") from None
    if not 1 <= replicas <= 5:
        raise InvalidArgument(f"replicas={replicas} in {url!r}: JetStream replicates 1 to 5 times", url=url)
    if not timeout > 0:
        raise InvalidArgument(f"timeout={timeout} in {url!r} must be positive (seconds)", url=url)
    return NatsUrl(servers, prefix, replicas, timeout, rest, _paired_kinds(url, params.get("kinds"), rest))


def _paired_kinds(url: str, named: str | None, rest: str | None) -> frozenset[str]:
    if named is None:
        return PAIRED_KINDS
    if rest is None:
        raise InvalidArgument(
            f"kinds= in {url!r} says what a paired store keeps on NATS, and this URL pairs with no SQL "
            "store: add rest=SQL-URL (last), or drop kinds= (a plain NATS store holds what it holds)",
            url=url,
        )
    names = named.split(",")
    unknown = [n for n in names if n not in PAIRABLE_KINDS]
    if not named or unknown:
        raise InvalidArgument(
            f"kinds={named!r} in {url!r}: name one or more of {', '.join(PAIRABLE_KINDS)}, separated by "
            "commas (the other kinds are always the SQL store's)",
            url=url,
        )
    if len(set(names)) != len(names):
        raise InvalidArgument(f"kinds={named!r} in {url!r} names a kind twice", url=url)
    return frozenset().union(*(PAIRABLE_KINDS[n] for n in names))


def paired_url(url: str) -> str | None:
    """The SQL URL a ``nats://`` URL pairs with (``rest=``), or None for a plain NATS store."""
    return parse_nats_url(url).rest
