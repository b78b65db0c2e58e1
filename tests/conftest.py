"""Shared fixtures: every contract test runs on memory, sqlite, postgres and mariadb, and on NATS where it
can.

PostgreSQL tests use the server at ``$STATEKEEL_TEST_PG`` (default ``postgresql://postgres@127.0.0.1:5432``).
Each test gets its own database, copied from a template migrated once per test session, and dropped after.
With ``CI=true`` a missing server fails the run; elsewhere those tests are skipped with the reason.

MariaDB tests use the server at ``$STATEKEEL_TEST_MARIADB`` (default ``mariadb://root@127.0.0.1:3306``), the
same way: a database per test, cloned from one migrated once per test session (its tables and triggers
re-created from the template's own definitions), and dropped after.
NATS tests use the JetStream server at ``$STATEKEEL_TEST_NATS`` (default ``nats://127.0.0.1:4222``); each
test's streams get a prefix of their own and are deleted after it. A plain NATS store holds some kinds
only: a contract test says which kinds it needs with ``@pytest.mark.kinds(...)`` (on the test or its
module), and runs on ``nats`` when the backend holds them all, and on ``nats+sqlite`` (NATS paired with a
SQLite file) when it needs a kind that the pairing puts on NATS; elsewhere it is skipped with the reason.
A test without the marker needs the whole store: it runs on the SQL backends only.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import os
import shutil
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pydantic
import pytest

import statekeel
from helpers import Kinds, Prepared, fill_kinds_store, fill_ui_store, strict_provider_types
from statekeel.backends.base import KIND_CONTRACTS
from statekeel.store import NATS_PAIRED_KINDS
from statekeel.transcripts import Dialect

PG_BASE = os.environ.get("STATEKEEL_TEST_PG", "postgresql://postgres@127.0.0.1:5432")
IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")
MY_BASE = os.environ.get("STATEKEEL_TEST_MARIADB", "mariadb://root@127.0.0.1:3306")
NATS_BASE = os.environ.get("STATEKEEL_TEST_NATS", "nats://127.0.0.1:4222")
BACKENDS = ["memory", "sqlite", "postgres", "mariadb", "nats", "nats+sqlite"]
# What ``@pytest.mark.kinds`` may name: the contract's kinds, "transactions" (``backend.atomic()``) and
# "store" (the whole store: recover(), health(), purge() visit every kind).
MARKER_NAMES = frozenset(KIND_CONTRACTS) | {"transactions", "store"}


def pg_url(database: str) -> str:
    return f"{PG_BASE}/{database}"


async def _pg_admin(sql: str) -> None:
    import asyncpg

    conn = await asyncpg.connect(pg_url("postgres"), timeout=5)
    try:
        await conn.execute(sql)
    finally:
        await conn.close()


def pg_admin(sql: str) -> None:
    """Run an administrative statement (CREATE/DROP DATABASE) on the test server."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        asyncio.run(_pg_admin(sql))
        return
    # Called from an async test: asyncio.run needs a thread of its own.
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        pool.submit(asyncio.run, _pg_admin(sql)).result()


_pg_state: dict[str, str | None] = {}


def pg_unavailable_reason() -> str | None:
    if "reason" not in _pg_state:
        try:
            import asyncpg  # noqa: F401

            pg_admin("SELECT 1")
            _pg_state["reason"] = None
        except Exception as exc:  # any failure means: no usable server here
            _pg_state["reason"] = f"PostgreSQL at {PG_BASE} is not available: {type(exc).__name__}: {exc}"
    return _pg_state["reason"]


def require_pg() -> None:
    reason = pg_unavailable_reason()
    if reason is not None:
        if IN_CI:
            pytest.fail(f"CI=true requires PostgreSQL: {reason}")
        pytest.skip(reason)


@pytest.fixture(scope="session")
def pg_template() -> Iterator[str]:
    """A database migrated to the current schema, used as a template for each test's database."""
    require_pg()
    name = f"sk_tmpl_{os.getpid()}_{uuid.uuid4().hex[:6]}"
    pg_admin(f'CREATE DATABASE "{name}"')

    async def migrate() -> None:
        store = await statekeel.open_store(pg_url(name))
        await store.close()

    asyncio.run(migrate())
    try:
        yield name
    finally:
        pg_admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture
def pg_database(request: pytest.FixtureRequest) -> Iterator[str]:
    """A fresh, empty (unmigrated) PostgreSQL database for this test; its URL."""
    require_pg()
    name = f"sk_test_{uuid.uuid4().hex[:12]}"
    pg_admin(f'CREATE DATABASE "{name}"')
    try:
        yield pg_url(name)
    finally:
        pg_admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture
def pg_migrated(pg_template: str) -> Iterator[str]:
    """A fresh PostgreSQL database at the current schema (copied from the template); its URL."""
    name = f"sk_test_{uuid.uuid4().hex[:12]}"
    pg_admin(f'CREATE DATABASE "{name}" TEMPLATE "{pg_template}"')
    try:
        yield pg_url(name)
    finally:
        pg_admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def my_url(database: str) -> str:
    return f"{MY_BASE}/{database}"


def _my_connect_kwargs() -> dict[str, Any]:
    from urllib.parse import urlsplit

    parts = urlsplit(MY_BASE)
    return {
        "host": parts.hostname or "127.0.0.1",
        "port": parts.port or 3306,
        "user": parts.username or "root",
        "password": parts.password or "",
        "connect_timeout": 5,
        "autocommit": True,
    }


async def _my_admin(*statements: str) -> list[tuple[Any, ...]]:
    import asyncmy

    conn = await asyncmy.connect(**_my_connect_kwargs())
    rows: list[tuple[Any, ...]] = []
    try:
        async with conn.cursor() as cur:
            for sql in statements:
                await cur.execute(sql)
                if cur.description:
                    rows = list(await cur.fetchall())
    finally:
        conn.close()
    return rows


def my_admin(*statements: str) -> list[tuple[Any, ...]]:
    """Run administrative statements (CREATE/DROP DATABASE …) on the MariaDB test server, in one session;
    the rows of the last one that returns rows."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(_my_admin(*statements))
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, _my_admin(*statements)).result()


_my_state: dict[str, str | None] = {}


def my_unavailable_reason() -> str | None:
    if "reason" not in _my_state:
        try:
            import asyncmy  # noqa: F401

            my_admin("SELECT 1")
            _my_state["reason"] = None
        except Exception as exc:  # any failure means: no usable server here
            _my_state["reason"] = f"MariaDB at {MY_BASE} is not available: {type(exc).__name__}: {exc}"
    return _my_state["reason"]


def require_mariadb() -> None:
    reason = my_unavailable_reason()
    if reason is not None:
        if IN_CI:
            pytest.fail(f"CI=true requires MariaDB: {reason}")
        pytest.skip(reason)


def _my_schema_of(database: str) -> list[str]:
    """The statements that re-create ``database``'s tables and triggers elsewhere."""
    tables = my_admin(
        f"SELECT table_name FROM information_schema.tables WHERE table_schema = '{database}' "
        "ORDER BY table_name"
    )
    triggers = my_admin(
        f"SELECT trigger_name FROM information_schema.triggers WHERE trigger_schema = '{database}' "
        "ORDER BY action_order"
    )
    ddl = [my_admin(f"SHOW CREATE TABLE `{database}`.`{t}`")[0][1] for (t,) in tables]
    ddl += [my_admin(f"SHOW CREATE TRIGGER `{database}`.`{t}`")[0][2] for (t,) in triggers]
    return ddl


@pytest.fixture(scope="session")
def my_template() -> Iterator[tuple[str, list[str]]]:
    """A MariaDB database migrated to the current schema, and the DDL that re-creates it."""
    require_mariadb()
    name = f"sk_tmpl_{os.getpid()}_{uuid.uuid4().hex[:6]}"
    my_admin(f"CREATE DATABASE `{name}` CHARACTER SET utf8mb4 COLLATE utf8mb4_bin")

    async def migrate() -> None:
        store = await statekeel.open_store(my_url(name))
        await store.close()

    try:
        asyncio.run(migrate())
        yield name, _my_schema_of(name)
    finally:
        my_admin(f"DROP DATABASE IF EXISTS `{name}`")


@pytest.fixture
def my_database() -> Iterator[str]:
    """A fresh, empty (unmigrated) MariaDB database for this test; its URL."""
    require_mariadb()
    name = f"sk_test_{uuid.uuid4().hex[:12]}"
    my_admin(f"CREATE DATABASE `{name}` CHARACTER SET utf8mb4 COLLATE utf8mb4_bin")
    try:
        yield my_url(name)
    finally:
        my_admin(f"DROP DATABASE IF EXISTS `{name}`")


class _MyClones:
    """Databases at the current schema, cloned from the template a little ahead of the tests that take
    them (on a thread of their own, so a test does not wait for the server's DDL), and dropped after."""

    AHEAD = 2

    def __init__(self, template: str, ddl: list[str]) -> None:
        self.template, self.ddl = template, ddl
        self.worker = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="mariadb-clones")
        self.ahead: list[concurrent.futures.Future[str]] = []

    def _make(self) -> str:
        name = f"sk_test_{uuid.uuid4().hex[:12]}"
        asyncio.run(
            _my_admin(
                f"CREATE DATABASE `{name}` CHARACTER SET utf8mb4 COLLATE utf8mb4_bin",
                f"USE `{name}`",
                "SET foreign_key_checks = 0",
                *self.ddl,
                f"INSERT INTO schema_migrations SELECT * FROM `{self.template}`.schema_migrations",
                f"INSERT INTO statekeel_locks SELECT * FROM `{self.template}`.statekeel_locks",
            )
        )
        return name

    def take(self) -> str:
        while len(self.ahead) <= self.AHEAD:
            self.ahead.append(self.worker.submit(self._make))
        try:
            return self.ahead.pop(0).result()
        except Exception:  # a clone cut off (a test restarted the server meanwhile): make it again
            return self._make()

    def drop(self, name: str) -> None:
        self.worker.submit(lambda: asyncio.run(_my_admin(f"DROP DATABASE IF EXISTS `{name}`")))

    def close(self) -> None:
        for future in self.ahead:
            if future.exception() is None:
                self.drop(future.result())
        self.worker.shutdown(wait=True)


@pytest.fixture(scope="session")
def my_clones(my_template: tuple[str, list[str]]) -> Iterator[_MyClones]:
    clones = _MyClones(*my_template)
    try:
        yield clones
    finally:
        clones.close()


@pytest.fixture
def my_migrated(my_clones: _MyClones) -> Iterator[str]:
    """A fresh MariaDB database at the current schema (cloned from the template); its URL."""
    name = my_clones.take()
    try:
        yield my_url(name)
    finally:
        my_clones.drop(name)


_nats_state: dict[str, str | None] = {}


def _run_async(coro: Any) -> Any:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coro)
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, coro).result()


async def _nats_check() -> None:
    import nats

    nc = await nats.connect(NATS_BASE, connect_timeout=3, max_reconnect_attempts=0, allow_reconnect=False)
    try:
        await nc.jetstream().account_info()
    finally:
        await nc.close()


def nats_unavailable_reason() -> str | None:
    if "reason" not in _nats_state:
        try:
            _run_async(_nats_check())
            _nats_state["reason"] = None
        except Exception as exc:  # any failure means: no usable server here
            why = f"{type(exc).__name__}: {exc}"
            _nats_state["reason"] = f"NATS JetStream at {NATS_BASE} is not available: {why}"
    return _nats_state["reason"]


def require_nats() -> None:
    reason = nats_unavailable_reason()
    if reason is not None:
        if IN_CI:
            pytest.fail(f"CI=true requires NATS JetStream: {reason}")
        pytest.skip(reason)


async def _delete_streams(servers: str, prefix: str) -> None:
    import nats

    nc = await nats.connect(servers, connect_timeout=3, max_reconnect_attempts=0, allow_reconnect=False)
    try:
        js = nc.jetstream()
        for info in await js.streams_info():
            if info.config.name and info.config.name.startswith(f"{prefix}_"):
                await js.delete_stream(info.config.name)
    finally:
        await nc.close()


def delete_nats_streams(prefix: str, servers: str = NATS_BASE) -> None:
    """Delete the streams a test created under ``prefix``."""
    _run_async(_delete_streams(servers, prefix))


@pytest.fixture
def nats_url() -> Iterator[str]:
    """A URL of an empty plain NATS store (streams under a prefix of its own, deleted after the test)."""
    require_nats()
    prefix = f"sk{uuid.uuid4().hex[:12]}"
    try:
        yield f"{NATS_BASE}?prefix={prefix}"
    finally:
        delete_nats_streams(prefix)


def _needed_kinds(request: pytest.FixtureRequest) -> frozenset[str] | None:
    marker = request.node.get_closest_marker("kinds")
    if marker is None:
        return None
    names = frozenset(marker.args)
    unknown = names - MARKER_NAMES
    if unknown or not names:
        pytest.fail(f"@pytest.mark.kinds names {sorted(unknown) or 'nothing'}; use {sorted(MARKER_NAMES)}")
    return names


def _skip_unless_nats_can(backend_name: str, request: pytest.FixtureRequest) -> None:
    from statekeel.backends.nats.backend import NATS_KINDS

    needs = _needed_kinds(request)
    assert needs is not None  # unmarked tests are not parametrized over the NATS backends
    if backend_name == "nats":
        missing = needs - NATS_KINDS
        if missing:
            pytest.skip(f"a plain NATS store does not hold {sorted(missing)}: covered by nats+sqlite or SQL")
    elif not needs & NATS_PAIRED_KINDS:
        pytest.skip(f"nats+sqlite holds {sorted(needs)} in SQLite: covered by the sqlite run")
    elif "transactions" in needs and (on_nats := needs & NATS_PAIRED_KINDS - {"traces"}):
        # Sessions and audit entries on NATS are not in the SQL transaction of atomic() (spans never
        # are written inside a block, on any store).
        pytest.skip(f"nats+sqlite keeps {sorted(on_nats)} outside SQL transactions")


SQL_BACKENDS = ["memory", "sqlite", "postgres", "mariadb"]


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """Every store test runs on the SQL backends; one marked with the kinds it needs runs on the NATS
    backends too (skipped there, with the reason, when they do not hold those kinds)."""
    if "backend_name" in metafunc.fixturenames:
        marked = metafunc.definition.get_closest_marker("kinds") is not None
        metafunc.parametrize("backend_name", BACKENDS if marked else SQL_BACKENDS, indirect=True)


@pytest.fixture
def backend_name(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def store_url(backend_name: str, tmp_path: os.PathLike[str], request: pytest.FixtureRequest) -> str:
    """A URL of an empty store on each backend."""
    if backend_name == "memory":
        return "memory://"
    if backend_name == "sqlite":
        return f"sqlite:///{os.path.join(os.fspath(tmp_path), 'store.db')}"
    if backend_name == "mariadb":
        return str(request.getfixturevalue("my_migrated"))
    if backend_name.startswith("nats"):
        _skip_unless_nats_can(backend_name, request)
        url = str(request.getfixturevalue("nats_url"))
        if backend_name == "nats+sqlite":
            url += f"&rest=sqlite:///{os.path.join(os.fspath(tmp_path), 'store.db')}"
        return url
    return str(request.getfixturevalue("pg_migrated"))


@pytest.fixture
async def store(store_url: str, tmp_path: os.PathLike[str]) -> AsyncIterator[statekeel.Store]:
    """An open store on each backend, closed after the test."""
    s = await statekeel.open_store(store_url, fallback_dir=os.path.join(os.fspath(tmp_path), "fallback"))
    try:
        yield s
    finally:
        await s.close()


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres), "mariadb"])
def shared_url(request: pytest.FixtureRequest, tmp_path: os.PathLike[str]) -> str:
    """A URL of an empty store that other processes can open too: a SQLite file, or a PostgreSQL or
    MariaDB database at the current schema."""
    if request.param == "sqlite":
        return f"sqlite:///{os.path.join(os.fspath(tmp_path), 'store.db')}"
    if request.param == "mariadb":
        return str(request.getfixturevalue("my_migrated"))
    return str(request.getfixturevalue("pg_migrated"))


@pytest.fixture(scope="module")
def provider_types() -> Iterator[dict[Dialect, pydantic.TypeAdapter[Any]]]:
    """The OpenAI chat, OpenAI Responses and Anthropic message types, refusing unknown keys as the APIs do:
    pass them to ``helpers.type_errors`` / ``helpers.assert_accepted``."""
    with strict_provider_types() as adapters:
        yield adapters


@pytest.fixture(scope="session")
def prepared(tmp_path_factory: pytest.TempPathFactory) -> Prepared:
    """A SQLite store holding every kind of state the UI shows (``helpers.fill_ui_store``), closed: the UI
    tests only read it, and one checks the file is byte-identical afterwards."""
    path = tmp_path_factory.mktemp("ui") / "agent-state.db"
    return asyncio.run(fill_ui_store(f"sqlite:///{path}"))


@pytest.fixture
def prepared_pg(pg_migrated: str) -> Prepared:
    """The same store on PostgreSQL."""
    return asyncio.run(fill_ui_store(pg_migrated))


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def filled(request: pytest.FixtureRequest, tmp_path: Path) -> Prepared:
    """A store holding every kind of state (a tampered audit entry, a tool call without a result, an
    expired lease …) that this test may change: a copy of the prepared SQLite file, or a fresh PostgreSQL
    database. The command-line tests run ``statekeel`` against it."""
    if request.param == "postgres":
        prepared_pg: Prepared = request.getfixturevalue("prepared_pg")
        return prepared_pg
    prepared: Prepared = request.getfixturevalue("prepared")
    path = tmp_path / "agent-state.db"
    shutil.copyfile(prepared.path, path)  # closed: everything is in the file
    return dataclasses.replace(prepared, path=path, url=f"sqlite:///{path}")


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def kinds(request: pytest.FixtureRequest, tmp_path: Path) -> Kinds:
    """A store holding memories, file records (with their files under a root, some changed since),
    vectors, a forked session with usage and its traces (``helpers.fill_kinds_store``), on SQLite and
    on PostgreSQL."""
    root = tmp_path / "project"
    root.mkdir()
    if request.param == "postgres":
        url = str(request.getfixturevalue("pg_migrated"))
    else:
        url = f"sqlite:///{tmp_path / 'kinds.db'}"
    return asyncio.run(fill_kinds_store(url, root))


# The backend markers (``-m sqlite``, ``-m "not mariadb"``): added from a test's backend parameter, so a
# topic runs on one engine without naming parameter ids. ``nats+sqlite`` needs the NATS server: ``nats``.
_BACKEND_MARKERS = {name: name.partition("+")[0] for name in BACKENDS}
_BACKEND_PARAMS = ("backend_name", "shared_url", "filled", "kinds")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        callspec = getattr(item, "callspec", None)
        if callspec is None:
            continue
        for param in _BACKEND_PARAMS:
            value = callspec.params.get(param)
            if isinstance(value, str) and value in _BACKEND_MARKERS:
                item.add_marker(_BACKEND_MARKERS[value])


def pytest_runtest_setup(item: pytest.Item) -> None:
    # A test that stops the shared server would fail the tests other workers run on it meanwhile: under
    # pytest-xdist it waits for README's serial phase (``-m stops_shared_server``, one process).
    if item.get_closest_marker("stops_shared_server") and os.environ.get("PYTEST_XDIST_WORKER"):
        pytest.skip("stops the shared server: runs in the serial phase (pytest -m stops_shared_server)")
