"""Parsing postgresql:// URLs: statekeel's options are validated before any connection is tried."""

from __future__ import annotations

import pytest

import statekeel
from statekeel.backends.postgres.backend import (
    CONNECT_TIMEOUT_S,
    DEFAULT_MAX_SIZE,
    DEFAULT_MIN_SIZE,
    PgTarget,
    translate,
)
from statekeel.backends.postgres.target import FAILOVER_TIMEOUT_S


def test_url_options_are_read_and_removed_from_the_dsn() -> None:
    t = PgTarget(
        "postgresql://alice:s3cret@db.example:6432/agents"
        "?pgbouncer=true&pool_min_size=0&pool_max_size=3&connect_timeout=2.5&sslmode=disable"
    )
    assert (t.host, t.port, t.database) == ("db.example", 6432, "agents")
    assert t.pgbouncer is True
    assert (t.min_size, t.max_size, t.connect_timeout) == (0, 3, 2.5)
    # asyncpg must not see statekeel's options (it would send them to the server as settings).
    assert "pgbouncer" not in t.dsn and "pool_" not in t.dsn and "connect_timeout" not in t.dsn
    assert "sslmode=disable" in t.dsn


def test_url_without_options_gets_the_defaults() -> None:
    t = PgTarget("postgresql://postgres@127.0.0.1/postgres")
    assert t.port == 5432
    assert t.pgbouncer is False
    assert (t.min_size, t.max_size, t.connect_timeout) == (
        DEFAULT_MIN_SIZE,
        DEFAULT_MAX_SIZE,
        CONNECT_TIMEOUT_S,
    )


def test_target_names_host_and_database_but_never_the_password() -> None:
    t = PgTarget("postgresql://alice:hunter2-secret@db.example:5433/agents")
    assert str(t) == "postgresql://db.example:5433/agents"
    assert "hunter2" not in str(t)
    assert t.scrub("auth for hunter2-secret failed") == "auth for *** failed"


def test_driver_errors_scrub_a_query_string_password() -> None:
    # asyncpg accepts ``?password=…``: driver messages quoting it are scrubbed like ``user:password@``.
    target = PgTarget("postgresql://ada@127.0.0.1:1/none?password=s3cret&connect_timeout=2")
    assert "s3cret" not in target.scrub("FATAL: password s3cret rejected")
    assert "s3cret" not in str(target)


@pytest.mark.parametrize(
    "query",
    [
        "pgbouncer=maybe",
        "pool_max_size=0",
        "pool_max_size=-1",
        "pool_min_size=x",
        "pool_min_size=5&pool_max_size=2",
        "connect_timeout=0",
        "connect_timeout=soon",
    ],
)
def test_bad_url_option_raises_invalid_argument(query: str) -> None:
    with pytest.raises(statekeel.InvalidArgument):
        PgTarget(f"postgresql://postgres@localhost/db?{query}")


def test_bad_port_raises_invalid_argument_without_the_password() -> None:
    with pytest.raises(statekeel.InvalidArgument) as info:
        PgTarget("postgresql://alice:pw-9f3a@localhost:notaport/db")
    assert "pw-9f3a" not in str(info.value)


def test_not_a_postgres_url_does_not_echo_the_url() -> None:
    with pytest.raises(statekeel.InvalidArgument) as info:
        PgTarget("mysql://alice:pw-9f3a@localhost/db")
    assert "pw-9f3a" not in str(info.value)


async def test_bad_url_option_fails_open_store_before_connecting() -> None:
    # Port 1 would refuse or hang; the option error must come first.
    with pytest.raises(statekeel.InvalidArgument, match="pool_max_size"):
        await statekeel.open_store("postgresql://postgres@127.0.0.1:1/db?pool_max_size=0")


@pytest.mark.parametrize("query", ["pool_max_size=²", "pool_min_size=¹", "pool_max_size=٣"])
async def test_postgres_pool_size_that_is_not_ascii_digits_raises_invalid_argument(query: str) -> None:
    # str.isdigit() accepts superscripts (int() then fails) and other scripts' digits.
    with pytest.raises(statekeel.InvalidArgument, match="pool_"):
        await statekeel.open_store(f"postgresql://u@127.0.0.1:1/db?{query}")


async def test_postgres_url_with_several_hosts_fails_to_connect_with_backend_unavailable() -> None:
    # The default fallback directory is named after the URL, whose port list ("1,127.0.0.1:2") is not one
    # int: it is still named, and asyncpg tries the hosts in turn.
    url = "postgresql://u@127.0.0.1:1,127.0.0.1:2/db?connect_timeout=2&failover_timeout=0"
    with pytest.raises(statekeel.BackendUnavailable):
        await statekeel.open_store(url)


def test_translate_keeps_statekeel_errors_and_scrubs_driver_messages() -> None:
    t = PgTarget("postgresql://alice:topsecret@h/db")
    original = statekeel.NotFound("x")
    assert translate(original, t) is original
    err = translate(OSError("could not reach h with password topsecret"), t)
    assert isinstance(err, statekeel.BackendUnavailable)
    assert "topsecret" not in str(err)
    assert (err.host, err.database) == ("h", "db")  # type: ignore[attr-defined]


def test_url_with_several_hosts_lists_each_host_and_port() -> None:
    t = PgTarget("postgresql://ada:pw@db1:5433,db2,[::1]:5435/agents?target_session_attrs=read-write")
    assert t.hosts == [("db1", 5433), ("db2", 5432), ("::1", 5435)]
    assert (t.host, t.port) == ("db1:5433,db2:5432,::1:5435", None)
    assert str(t) == "postgresql://db1:5433,db2:5432,::1:5435/agents"
    assert t.session_attrs == "read-write" and not t.read_only
    # asyncpg gets the host list and target_session_attrs as they were written.
    assert t.dsn.startswith("postgresql://ada:pw@db1:5433,db2,[::1]:5435/agents?")
    assert "target_session_attrs=read-write" in t.dsn


def test_failover_timeout_defaults_to_ten_seconds_with_several_hosts_and_none_with_one() -> None:
    assert PgTarget("postgresql://u@h1,h2/db").failover_timeout == FAILOVER_TIMEOUT_S == 10.0
    assert PgTarget("postgresql://u@h1/db").failover_timeout == 0.0
    t = PgTarget("postgresql://u@h1,h2/db?failover_timeout=2.5")
    assert t.failover_timeout == 2.5
    assert "failover_timeout" not in t.dsn  # statekeel's option, not a server setting


@pytest.mark.parametrize("attrs", ["prefer-standby", "standby", "read-only"])
def test_standby_session_attrs_make_a_read_only_target(attrs: str) -> None:
    assert PgTarget(f"postgresql://u@h1,h2/db?target_session_attrs={attrs}").read_only


@pytest.mark.parametrize(
    "url",
    [
        "postgresql://u@h1,h2/db?target_session_attrs=primary-ish",
        "postgresql://u@h1,h2/db?failover_timeout=-1",
        "postgresql://u@h1,h2/db?failover_timeout=soon",
        "postgresql://u@h1:5432,h2:port/db",
        "postgresql://u@h1:5432,h2:70000/db",
    ],
)
def test_bad_failover_url_raises_invalid_argument_naming_the_option(url: str) -> None:
    with pytest.raises(statekeel.InvalidArgument) as info:
        PgTarget(url)
    assert any(word in str(info.value) for word in ("target_session_attrs", "failover_timeout", "port"))


async def test_failover_wait_for_a_primary_is_bounded_and_names_every_host() -> None:
    # Two ports where nothing listens: the call retries with backoff for failover_timeout, then gives up
    # with BackendUnavailable naming both hosts and a retry hint — never a hang.
    import time

    url = "postgresql://u@127.0.0.1:1,127.0.0.1:2/db?failover_timeout=1&connect_timeout=2"
    started = time.monotonic()
    with pytest.raises(statekeel.BackendUnavailable) as info:
        await statekeel.open_store(url)
    assert 1.0 <= time.monotonic() - started < 6
    assert "127.0.0.1:1, 127.0.0.1:2" in str(info.value)
    assert info.value.retry_after == 1.0  # type: ignore[attr-defined]


def test_failover_no_matching_host_is_backend_unavailable_naming_every_host_as_standby() -> None:
    import asyncpg

    t = PgTarget("postgresql://u:pw-77@h1:5433,h2:5434/db?target_session_attrs=read-write")
    err = translate(asyncpg.TargetServerAttributeNotMatched("None of the hosts match"), t)
    assert isinstance(err, statekeel.BackendUnavailable)
    assert "h1:5433, h2:5434" in str(err) and "standby" in str(err)
    assert err.retry_after == 1.0  # type: ignore[attr-defined]
    assert "pw-77" not in str(err)


async def test_failover_timeout_on_one_host_waits_for_it_then_gives_a_retry_hint() -> None:
    # One DNS name that a managed service moves to the new primary: the wait is opt-in with one host.
    import time

    url = "postgresql://u@127.0.0.1:1/db?failover_timeout=1&connect_timeout=2"
    started = time.monotonic()
    with pytest.raises(statekeel.BackendUnavailable) as info:
        await statekeel.open_store(url)
    assert 1.0 <= time.monotonic() - started < 6
    assert info.value.retry_after == 1.0  # type: ignore[attr-defined]
