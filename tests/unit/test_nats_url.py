"""``nats://`` URLs and what a NATS store holds: the ``rest=`` pairing read verbatim, bad options refused,
names mapped to subject tokens that round-trip, and ``Unsupported`` for the kinds a plain NATS store does
not hold (raised before anything is written; no server is needed for any of these)."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

import statekeel
from statekeel.backends.nats.client import decode_token, encode_token
from statekeel.backends.nats.url import parse_nats_url
from statekeel.fallback import default_dir
from statekeel.store import Store, StoreOptions


def test_a_plain_url_names_its_servers_and_defaults() -> None:
    parsed = parse_nats_url("nats://127.0.0.1:4222")
    assert parsed.servers == ("nats://127.0.0.1:4222",)
    assert (parsed.prefix, parsed.replicas, parsed.timeout, parsed.rest) == ("statekeel", 1, 5.0, None)


def test_several_servers_and_credentials_are_kept_for_each() -> None:
    parsed = parse_nats_url("nats://me:pw@h1:4222,h2:4223/?replicas=3&prefix=agents")
    assert parsed.servers == ("nats://me:pw@h1:4222", "nats://me:pw@h2:4223")
    assert (parsed.prefix, parsed.replicas) == ("agents", 3)


def test_rest_takes_everything_after_it_verbatim() -> None:
    pg = "postgresql://u@db:5432/state?target_session_attrs=read-write&application_name=x"
    assert parse_nats_url(f"nats://h:4222?prefix=p&rest={pg}").rest == pg
    assert parse_nats_url("nats://h:4222?rest=sqlite:////abs/state.db").rest == "sqlite:////abs/state.db"
    assert parse_nats_url("nats://h:4222?rest=sqlite:////abs/state.db").prefix == "statekeel"


@pytest.mark.parametrize(
    "url",
    [
        "nats://h:4222?rest=",
        "nats://h:4222?colour=blue",
        "nats://h:4222?prefix=a.b",
        "nats://h:4222?prefix=",
        "nats://h:4222?prefix=a&prefix=b",
        "nats://h:4222?replicas=7",
        "nats://h:4222?replicas=two",
        "nats://h:4222?timeout=0",
        "nats://h:4222/some/path",
        "nats://",
        "nats://h:4222?rest=nats://other:4222",
    ],
)
def test_bad_urls_are_refused_before_connecting(url: str) -> None:
    with pytest.raises(statekeel.InvalidArgument):
        Store(url, StoreOptions())


@given(st.text())
def test_every_name_round_trips_through_one_subject_token(name: str) -> None:
    token = encode_token(name)
    assert token and not any(c in token for c in ".*> \t\r\n")
    assert decode_token(token) == name


@pytest.mark.parametrize("name", ["a.b", "*", ">", "two words", "ünïcødé ✓", "a\x00b", ""])
def test_keys_with_subject_syntax_map_to_distinct_tokens(name: str) -> None:
    assert decode_token(encode_token(name)) == name
    assert encode_token(name) != encode_token(name + ".")


def test_a_name_that_is_not_unicode_text_is_an_invalid_key() -> None:
    with pytest.raises(statekeel.InvalidKey, match="NATS subject"):
        encode_token("half a surrogate \ud800")


def test_a_plain_nats_store_refuses_a_kind_it_does_not_hold_when_it_is_opened() -> None:
    store = Store("nats://127.0.0.1:4222?prefix=never_opened", StoreOptions())
    assert store.holds("sessions") and store.holds("audit") and store.holds("traces")
    first_missing = {"tasks": "tasks", "workflows": "tasks", "approvals": "approvals", "memory": "memory"}
    for manager in ("tasks", "workflows", "approvals", "memory", "files", "vectors"):
        assert not store.holds(manager)
        with pytest.raises(statekeel.Unsupported, match=f"store.{manager} is not available") as caught:
            getattr(store, manager)  # opening the manager, before any of its operations
        error = caught.value
        assert error.kind == first_missing.get(manager, manager)  # type: ignore[attr-defined]
        assert error.holds == ["audit", "erasure", "lifecycle", "sessions", "tool_calls", "traces"]  # type: ignore[attr-defined]
        assert "nats://127.0.0.1:4222?prefix=never_opened&rest=sqlite:///state.db" in str(error)
    assert issubclass(statekeel.Unsupported, statekeel.StatekeelError)


async def test_purge_on_a_plain_nats_store_is_refused_whole_before_any_batch() -> None:
    store = Store("nats://127.0.0.1:4222?prefix=never_opened", StoreOptions())
    with pytest.raises(statekeel.Unsupported, match=r"does not hold retention, so store.purge\(\)") as caught:
        await store.purge(dry_run=True)  # never connected: refused before reaching the server
    assert caught.value.kind == "retention"  # type: ignore[attr-defined]


def test_holds_answers_for_managers_and_state_kinds_without_raising() -> None:
    store = Store("nats://127.0.0.1:4222?prefix=never_opened", StoreOptions())
    assert store.holds("tool_calls") and store.holds("erasure") and not store.holds("checkpoints")
    with pytest.raises(statekeel.InvalidArgument, match="neither a manager"):
        store.holds("tables")


def test_the_refusal_names_the_composite_url_without_the_password() -> None:
    store = Store("nats://me:secret@127.0.0.1:4222", StoreOptions())
    with pytest.raises(statekeel.Unsupported) as caught:
        store.memory  # noqa: B018 - opening it is what raises
    assert "secret" not in str(caught.value)
    assert "nats://me:***@127.0.0.1:4222?rest=sqlite:///state.db" in str(caught.value)


async def test_an_operation_of_a_kind_not_held_is_refused_by_the_backend_itself() -> None:
    store = Store("nats://127.0.0.1:4222?prefix=never_opened", StoreOptions())
    with pytest.raises(statekeel.Unsupported, match="does not hold tasks") as caught:
        await store.backend.get_task("t")
    assert caught.value.kind == "tasks"


def test_a_paired_store_puts_sessions_audit_and_traces_on_nats_and_the_rest_in_sql(tmp_path: object) -> None:
    store = Store(f"nats://127.0.0.1:4222?prefix=p&rest=sqlite:///{tmp_path}/s.db", StoreOptions())
    assert all(store.holds(m) for m in ("sessions", "tasks", "approvals", "audit", "traces", "memory"))
    backend: Any = store.backend
    for kind in ("sessions", "tool_calls", "audit", "traces"):
        assert type(backend.backend_for(kind)).__name__ == "NatsBackend"
    for kind in ("tasks", "workflows", "approvals", "memory", "files", "vectors", "checkpoints"):
        assert type(backend.backend_for(kind)).__name__ == "SqliteBackend"
    # Retention and the row copy visit sessions as SQL rows: refused whole, not done for some kinds.
    assert not store.holds("retention") and not store.holds("copy")


@pytest.mark.parametrize(
    ("named", "on_nats"),
    [
        ("traces", {"traces"}),
        ("audit,traces", {"audit", "traces"}),
        ("sessions", {"sessions", "tool_calls"}),
        ("sessions,audit,traces", {"sessions", "tool_calls", "audit", "traces"}),
    ],
)
def test_kinds_says_what_a_paired_store_keeps_on_nats(
    tmp_path: object, named: str, on_nats: set[str]
) -> None:
    url = f"nats://127.0.0.1:4222?prefix=p&kinds={named}&rest=sqlite:///{tmp_path}/s.db"
    assert parse_nats_url(url).kinds == on_nats
    backend: Any = Store(url, StoreOptions()).backend
    assert backend.front_kinds == on_nats
    assert "kinds=" not in backend.front.url  # the NATS store itself holds what it holds
    assert Store(url, StoreOptions()).holds("retention") == ("sessions" not in on_nats)


@pytest.mark.parametrize(
    "url",
    [
        "nats://h:4222?kinds=traces",
        "nats://h:4222?kinds=tasks&rest=sqlite:///s.db",
        "nats://h:4222?kinds=&rest=sqlite:///s.db",
        "nats://h:4222?kinds=traces,traces&rest=sqlite:///s.db",
        "nats://h:4222?kinds=traces&kinds=audit&rest=sqlite:///s.db",
    ],
)
def test_bad_kinds_are_refused_before_connecting(url: str) -> None:
    with pytest.raises(statekeel.InvalidArgument, match="kinds"):
        Store(url, StoreOptions())


def test_fallback_files_of_a_paired_store_go_where_its_sql_store_puts_them(tmp_path: object) -> None:
    sql = f"sqlite:///{tmp_path}/s.db"
    assert default_dir(f"nats://h:4222?rest={sql}") == default_dir(sql)


def test_a_plain_nats_store_keeps_fallback_files_in_the_state_directory_per_servers_and_prefix(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("XDG_STATE_HOME", "/state")
    plain = default_dir("nats://me:pw@h2:4222,h1:4222?prefix=agents")
    assert plain is not None and plain.startswith("/state/statekeel/fallback/k-nats_5fh1_3a4222_2ch2_3a4222")
    assert plain == default_dir("nats://h1:4222,h2:4222?prefix=agents")  # not the credentials nor the order
    assert default_dir("nats://h1:4222,h2:4222") != plain  # another prefix: other streams, other files
