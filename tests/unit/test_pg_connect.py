"""A DSN that cannot work fails fast with BackendUnavailable naming host and database, never the password.

Real failures (wrong port, host, database, a role that may not log in) use the local server; a wrong
password and a server that never answers are played by a small fake server speaking the PostgreSQL wire
protocol, because the local server trusts local connections and would accept any password.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
import time
import uuid
from collections.abc import AsyncIterator

import pytest

import statekeel
from conftest import PG_BASE, pg_admin, require_pg

pytestmark = pytest.mark.postgres

_SSL_OR_GSS_REQUEST = {80877103, 80877104}


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
    return port


async def _read_startup(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    while True:
        (length,) = struct.unpack("!i", await reader.readexactly(4))
        body = await reader.readexactly(length - 4)
        if struct.unpack("!i", body[:4])[0] in _SSL_OR_GSS_REQUEST:
            writer.write(b"N")  # no TLS, no GSS: the client goes on in plain text
            await writer.drain()
            continue
        return


def _error_response(code: str, message: str) -> bytes:
    fields = b"".join(k + v.encode() + b"\0" for k, v in ((b"S", "FATAL"), (b"C", code), (b"M", message)))
    body = fields + b"\0"
    return b"E" + struct.pack("!i", len(body) + 4) + body


@contextlib.asynccontextmanager
async def _fake_server(*, answer: bool, received: list[bytes]) -> AsyncIterator[int]:
    """A server that asks for a cleartext password and rejects it (``answer``), or never says a word."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            if answer:
                await _read_startup(reader, writer)
                writer.write(b"R" + struct.pack("!ii", 8, 3))  # AuthenticationCleartextPassword
                await writer.drain()
                assert await reader.readexactly(1) == b"p"
                (length,) = struct.unpack("!i", await reader.readexactly(4))
                received.append(await reader.readexactly(length - 4))
                writer.write(_error_response("28P01", 'password authentication failed for user "alice"'))
                await writer.drain()
            else:
                await reader.read()  # silent until the client gives up
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    try:
        yield server.sockets[0].getsockname()[1]
    finally:
        server.close()
        await server.wait_closed()


async def _open_fails(url: str, *, within: float) -> statekeel.BackendUnavailable:
    started = time.monotonic()
    with pytest.raises(statekeel.BackendUnavailable) as info:
        await statekeel.open_store(url)
    assert time.monotonic() - started < within
    return info.value


async def test_wrong_password_raises_backend_unavailable_without_the_password() -> None:
    received: list[bytes] = []
    async with _fake_server(answer=True, received=received) as port:
        err = await _open_fails(
            f"postgresql://alice:Wr0ng-pass-7@127.0.0.1:{port}/agents?connect_timeout=5", within=10
        )
    assert received and b"Wr0ng-pass-7" in received[0]  # the client really sent it
    assert "authentication failed" in str(err)
    assert "127.0.0.1" in str(err) and "agents" in str(err)
    assert "Wr0ng-pass-7" not in str(err) and "Wr0ng-pass-7" not in repr(err.fields)
    assert (err.host, err.database) == ("127.0.0.1", "agents")  # type: ignore[attr-defined]


async def test_server_that_never_answers_times_out_within_the_connect_timeout() -> None:
    async with _fake_server(answer=False, received=[]) as port:
        err = await _open_fails(
            f"postgresql://alice:pw-silent@127.0.0.1:{port}/agents?connect_timeout=1", within=5
        )
    assert "127.0.0.1" in str(err) and "agents" in str(err)
    assert "pw-silent" not in str(err)


async def test_wrong_port_raises_backend_unavailable_naming_host_and_database() -> None:
    port = _closed_port()
    err = await _open_fails(
        f"postgresql://postgres:pw-port@127.0.0.1:{port}/agents?connect_timeout=3", within=10
    )
    assert f"127.0.0.1:{port}/agents" in str(err)
    assert "pw-port" not in str(err)


async def test_unresolvable_host_raises_backend_unavailable_naming_it() -> None:
    host = "statekeel-no-such-host.invalid"
    err = await _open_fails(f"postgresql://postgres:pw-host@{host}:5432/agents?connect_timeout=2", within=10)
    assert host in str(err) and "agents" in str(err)
    assert "pw-host" not in str(err)


async def test_missing_database_raises_backend_unavailable_naming_it() -> None:
    require_pg()
    name = f"sk_missing_{uuid.uuid4().hex[:8]}"
    err = await _open_fails(f"{PG_BASE}/{name}?connect_timeout=5", within=10)
    assert "does not exist" in str(err) and name in str(err)
    assert err.database == name  # type: ignore[attr-defined]


async def test_role_that_may_not_log_in_raises_backend_unavailable_without_the_password() -> None:
    require_pg()
    role = f"sk_nologin_{uuid.uuid4().hex[:8]}"
    await asyncio.to_thread(pg_admin, f"CREATE ROLE {role} NOLOGIN PASSWORD 'right-pw-5k'")
    try:
        host_part = PG_BASE.split("@", 1)[1]
        err = await _open_fails(
            f"postgresql://{role}:Wrong-pw-5k@{host_part}/postgres?connect_timeout=5", within=10
        )
        assert "authentication failed" in str(err)
        assert "Wrong-pw-5k" not in str(err) and "right-pw-5k" not in str(err)
    finally:
        await asyncio.to_thread(pg_admin, f"DROP ROLE IF EXISTS {role}")
