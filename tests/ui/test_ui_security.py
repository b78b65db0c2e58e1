"""The UI is read-only by construction and guarded: GET only, the database byte-identical after every
page was loaded, a token (in constant time) when asked for, loopback Host names otherwise, and security
headers on every response."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from pathlib import Path

import pytest
from starlette.routing import Route
from starlette.testclient import TestClient
from starlette.types import Message, Receive, Scope, Send

import statekeel
from helpers import Prepared
from statekeel.ui import LOOPBACK_NAMES, create_app
from statekeel.ui.app import Guard
from statekeel.ui.server import check_binding, is_loopback

BASE = "http://127.0.0.1:8765"
TOKEN = "s3cret-token-0123456789"


def digest(path: Path) -> dict[str, str]:
    """SHA-256 of the database and of its WAL and shared-memory files, when they exist."""
    found = {}
    for suffix in ("", "-wal", "-shm"):
        file = Path(str(path) + suffix)
        if file.exists() and (suffix != "-shm"):  # the -shm index is rebuilt by every reader
            found[suffix or "db"] = hashlib.sha256(file.read_bytes()).hexdigest()
    return found


def test_every_route_is_get_only(prepared: Prepared) -> None:
    app = create_app(prepared.url)
    routes = [r for r in app.routes if isinstance(r, Route)]
    assert len(routes) == len(app.routes) >= 11
    assert all(r.methods == {"GET", "HEAD"} for r in routes)
    with TestClient(app, base_url=BASE) as client:
        for route in routes:
            for method in ("POST", "PUT", "PATCH", "DELETE", "OPTIONS", "TRACE"):
                response = client.request(method, route.path)
                assert response.status_code == 405, (method, route.path)
                assert response.headers["allow"] == "GET, HEAD"


def test_the_database_is_byte_identical_after_browsing_every_page(prepared: Prepared) -> None:
    before = digest(prepared.path)
    mtime = prepared.path.stat().st_mtime_ns
    with TestClient(create_app(prepared.url), base_url=BASE) as client:
        for url in prepared.pages():
            assert client.get(url).status_code in (200, 404), url
    assert digest(prepared.path) == before
    assert prepared.path.stat().st_mtime_ns == mtime


def test_a_store_with_pending_migrations_is_not_upgraded(tmp_path: Path) -> None:
    db = tmp_path / "v1.sqlite"  # a store frozen at schema version 1
    db.write_bytes((Path(__file__).parents[1] / "migration" / "fixtures" / "v1.sqlite").read_bytes())
    before = db.read_bytes()
    with pytest.raises(statekeel.MigrationError), TestClient(create_app(f"sqlite:///{db}"), base_url=BASE):
        pass
    assert db.read_bytes() == before


@pytest.fixture
def guarded(prepared: Prepared) -> Iterator[TestClient]:
    with TestClient(create_app(prepared.url, token=TOKEN), base_url="http://10.1.2.3:8765") as client:
        yield client


def test_with_a_token_every_request_must_carry_it(guarded: TestClient) -> None:
    assert guarded.get("/").status_code == 401
    assert guarded.get("/static/style.css").status_code == 401
    assert guarded.get("/", params={"token": TOKEN[:-1] + "x"}).status_code == 401
    assert guarded.get("/", headers={"Authorization": "Bearer wrong"}).status_code == 401
    assert guarded.get("/", headers={"Authorization": f"Bearer {TOKEN}"}).status_code == 200
    page = guarded.get("/sessions", params={"token": TOKEN})
    assert page.status_code == 200
    # Links carry the token on, so that a browser opened at ?token= can follow them.
    assert f'href="/session?key=chat-openai&amp;token={TOKEN}"' in page.text
    assert guarded.get("/session", params={"key": "chat-openai", "token": TOKEN}).status_code == 200


def test_without_a_token_only_loopback_host_names_are_served(prepared: Prepared) -> None:
    app = create_app(prepared.url, allowed_hosts=LOOPBACK_NAMES)
    with TestClient(app, base_url=BASE) as client:
        for host in ("127.0.0.1:8765", "localhost:8765", "[::1]:8765", "LOCALHOST"):
            assert client.get("/", headers={"Host": host}).status_code == 200, host
        # A page of attacker.example whose name now points at 127.0.0.1 (DNS rebinding) gets nothing.
        refused = client.get("/", headers={"Host": "attacker.example:8765"})
        assert refused.status_code == 403 and "chat-openai" not in refused.text


def test_every_response_carries_the_security_headers(prepared: Prepared, guarded: TestClient) -> None:
    with TestClient(create_app(prepared.url), base_url=BASE) as client:
        responses = [client.get("/"), client.get("/nope"), client.post("/"), guarded.get("/")]
    for response in responses:
        csp = response.headers["content-security-policy"]
        assert "default-src 'none'" in csp and "script-src" not in csp and "style-src 'self'" in csp
        assert response.headers["x-content-type-options"] == "nosniff"
        assert response.headers["x-frame-options"] == "DENY"
        assert response.headers["referrer-policy"] == "no-referrer"


def test_pages_load_nothing_from_elsewhere_and_hold_no_script(prepared: Prepared) -> None:
    with TestClient(create_app(prepared.url), base_url=BASE) as client:
        for url in prepared.pages():
            page = client.get(url).text
            if url.endswith(".css"):
                assert "url(" not in page and "@import" not in page
                continue
            assert "<script" not in page.lower() and "http://" not in page.replace('xmlns="http://', "")
            assert "https://" not in page


def test_binding_beyond_loopback_needs_a_token_long_enough() -> None:
    assert is_loopback("127.0.0.1") and is_loopback("::1") and is_loopback("localhost")
    assert not is_loopback("0.0.0.0") and not is_loopback("192.168.1.4") and not is_loopback("example.com")
    check_binding("127.0.0.1", None)
    check_binding("0.0.0.0", TOKEN)
    with pytest.raises(statekeel.InvalidArgument, match="pass --token"):
        check_binding("0.0.0.0", None)
    with pytest.raises(statekeel.InvalidArgument, match="at least 16 characters"):
        check_binding("127.0.0.1", "short")
    with pytest.raises(statekeel.InvalidArgument, match="non-empty"):
        create_app("memory://", token="")


UNICODE_TOKEN = "jeton-sécret-ünïcødé-令牌-0123"


def test_a_correct_non_ascii_token_is_accepted_in_the_query(prepared: Prepared) -> None:
    app = create_app(prepared.url, token=UNICODE_TOKEN)
    with TestClient(app, base_url="http://10.1.2.3:8765") as client:
        page = client.get("/sessions", params={"token": UNICODE_TOKEN})
        assert page.status_code == 200
        # The links carry it on, percent-encoded as UTF-8, and following one works.
        assert (
            client.get("/session", params={"key": "chat-openai", "token": UNICODE_TOKEN}).status_code == 200
        )
        bearer = {"Authorization": b"Bearer " + UNICODE_TOKEN.encode("utf-8")}
        assert client.get("/", headers=bearer).status_code == 200


@pytest.mark.parametrize(
    "query",
    [
        "token=" + "jeton-s%C3%A9cret-%C3%BCn%C3%AFc%C3%B8d%C3%A9-%E4%BB%A4%E7%89%8C-0124",  # one char off
        "token=%E2%98%83",  # non-ASCII, wrong
        "token=",  # empty
        "token",  # no value
        "token=" + "x" * 20_000,  # overlong
        "token=%FF%FE%00",  # not UTF-8 at all
        "token=%ZZ",  # a broken escape
        "token=" + UNICODE_TOKEN[:-1],  # a prefix
    ],
)
def test_any_wrong_token_gets_401_never_500(prepared: Prepared, query: str) -> None:
    app = create_app(prepared.url, token=UNICODE_TOKEN)
    with TestClient(app, base_url="http://10.1.2.3:8765", raise_server_exceptions=False) as client:
        for path in ("/", "/sessions"):
            response = client.get(path + "?" + query)
            assert response.status_code == 401, (path, query[:40], response.status_code)
            assert "chat-openai" not in response.text
        wrong = {"Authorization": b"Bearer \xe2\x98\x83"}
        assert client.get("/", headers=wrong).status_code == 401


async def test_a_query_of_raw_bytes_that_are_not_utf8_gets_401() -> None:
    reached: list[bool] = []

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        reached.append(True)

    sent: list[Message] = []

    async def send(message: Message) -> None:
        sent.append(message)

    async def receive() -> Message:
        return {"type": "http.request", "body": b"", "more_body": False}

    guard = Guard(app, token=UNICODE_TOKEN, allowed_hosts=None)
    for query in (b"token=\xff\xfe", b"token=" + UNICODE_TOKEN.encode("utf-8")[:-1], b"token=%"):
        scope = {"type": "http", "method": "GET", "path": "/", "headers": [], "query_string": query}
        await guard(scope, receive, send)
        assert sent[0]["status"] == 401, query
        sent.clear()
    assert not reached
    # The same path, with the right token's raw UTF-8 bytes, reaches the application.
    scope = {
        "type": "http",
        "method": "GET",
        "path": "/",
        "headers": [],
        "query_string": b"token=" + UNICODE_TOKEN.encode("utf-8"),
    }
    await guard(scope, receive, send)
    assert reached == [True]
