"""The NATS JetStream backend under bad input and faults: streams missing or created with other limits,
names that are not subject tokens, messages over the server's max_payload, answers lost after a publish,
writers in several connections, and entries the server refuses to delete."""

from __future__ import annotations

import asyncio
import dataclasses
import datetime as dt
import sys
from collections.abc import AsyncIterator
from typing import Any

import nats
import nats.errors
import nats.js.errors
import orjson
import pytest
from nats.js.api import StreamConfig

import statekeel
from helpers import message
from statekeel.backends.base import NewSpan
from statekeel.backends.nats.client import NatsConnection, encode_token

Store = statekeel.Store
AT = dt.datetime(2026, 3, 1, 12, 0, tzinfo=dt.UTC)


def prefix_of(url: str) -> str:
    return url.partition("prefix=")[2].partition("&")[0]


@pytest.fixture
async def js(nats_url: str) -> AsyncIterator[Any]:
    """A JetStream context of its own on the test's server (what another program would use)."""
    nc = await nats.connect(nats_url.partition("?")[0])
    try:
        yield nc.jetstream()
    finally:
        await nc.close()


async def test_missing_streams_are_created_with_the_limits_statekeel_needs(nats_url: str, js: Any) -> None:
    prefix = prefix_of(nats_url)
    async with statekeel.open_store(nats_url) as store:
        assert await store.backend.integrity_check() == []
    audit = (await js.stream_info(f"{prefix}_audit")).config
    assert audit.deny_delete and audit.deny_purge and audit.max_age == 0 and audit.max_msgs == -1
    assert (await js.stream_info(f"{prefix}_traces")).config.max_msgs_per_subject == 1


async def test_a_stream_created_with_other_limits_is_refused_by_name_and_left_as_it_was(
    nats_url: str, js: Any
) -> None:
    prefix = prefix_of(nats_url)
    # Another program made the audit stream with a retention limit: entries would silently go.
    await js.add_stream(StreamConfig(name=f"{prefix}_audit", subjects=[f"{prefix}.audit.*"], max_age=3600))
    with pytest.raises(statekeel.StorageCorrupt, match=rf"{prefix}_audit.*max_age") as caught:
        await statekeel.open_store(nats_url)
    assert caught.value.stream == f"{prefix}_audit"
    assert (await js.stream_info(f"{prefix}_audit")).config.max_age == 3600  # not changed


async def test_a_stream_deleted_under_a_running_store_is_reported_by_the_integrity_check(
    nats_url: str, js: Any
) -> None:
    prefix = prefix_of(nats_url)
    async with statekeel.open_store(nats_url) as store:
        await js.delete_stream(f"{prefix}_traces")
        assert await store.backend.integrity_check() == [f"the NATS stream {prefix}_traces is missing"]
        assert not (await store.info()).ok


async def test_migrate_false_opens_nothing_it_would_have_to_create(nats_url: str, js: Any) -> None:
    with pytest.raises(statekeel.MigrationError, match="migrate=False"):
        await statekeel.open_store(nats_url, migrate=False)
    assert [s.config.name for s in await js.streams_info() if prefix_of(nats_url) in s.config.name] == []


async def test_a_layout_newer_than_the_code_is_refused(nats_url: str, js: Any) -> None:
    prefix = prefix_of(nats_url)
    async with statekeel.open_store(nats_url):
        pass
    await js.publish(f"{prefix}.meta", b'{"layout": 99, "created_at": 0}')
    with pytest.raises(statekeel.SchemaTooNew):
        await statekeel.open_store(nats_url)


async def test_names_with_subject_syntax_round_trip_and_never_match_each_other(nats_url: str) -> None:
    names = ["a.b", "a", "*", ">", "two words", "ünïcødé", "a.>"]
    async with statekeel.open_store(nats_url) as store:
        for name in names:
            await store.audit.append("k", "actor", name, {"name": name})
            store.traces.record(name, {"span_id": name, "name": "n"})
        await store.traces.flush()
        for name in names:
            assert [e.data["name"] for e in await store.audit.query(subject=name)] == [name]
            assert [(s.trace_id, s.span_id) for s in await store.traces.get(name)] == [(name, name)]
        assert (await store.audit.verify()).count == len(names)


async def test_an_entry_over_the_servers_max_payload_is_payload_too_large_and_nothing_is_written(
    nats_url: str,
) -> None:
    async with statekeel.open_store(nats_url) as store:
        conn: NatsConnection = store.backend.conn  # type: ignore[attr-defined]
        big = "x" * conn.max_payload
        with pytest.raises(statekeel.PayloadTooLarge, match="max_payload"):
            await store.audit.append("k", "a", "s", {"blob": big})
        assert await store.audit.query() == []
        assert (await store.audit.append("k", "a", "s")).seq == 1  # the store stays usable


async def test_a_span_batch_with_one_span_over_max_payload_is_refused_whole(nats_url: str) -> None:
    async with statekeel.open_store(nats_url) as store:
        backend: Any = store.backend

        def span(span_id: str, size: int) -> NewSpan:
            attrs = b'{"a":"' + b"x" * size + b'"}'
            return NewSpan("t", span_id, None, "n", "tool", "ok", attrs, AT, None)

        with pytest.raises(statekeel.PayloadTooLarge):
            await backend.write_spans([span("small", 10), span("big", backend.conn.max_payload)])
        assert await backend.read_trace("t") == []


async def test_a_publish_whose_answer_was_lost_is_stored_once(
    nats_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with statekeel.open_store(nats_url) as store:
        js = store.backend.conn.js  # type: ignore[attr-defined]
        real = js.publish
        lost: list[int] = []

        async def answer_lost_once(*args: Any, **kwargs: Any) -> Any:
            ack = await real(*args, **kwargs)  # stored by the server...
            if not lost:
                lost.append(ack.seq)
                raise nats.errors.TimeoutError  # ...but the answer never arrives
            return ack

        monkeypatch.setattr(js, "publish", answer_lost_once)
        entry = await store.audit.append("k", "a", "s", {"once": True})
        monkeypatch.setattr(js, "publish", real)
        assert lost == [1] and entry.seq == 1
        assert [e.seq for e in await store.audit.query()] == [1]
        assert (await store.audit.append("k", "a", "s")).seq == 2
        assert (await store.audit.verify()).ok


async def test_writers_on_several_connections_chain_one_dense_log(nats_url: str) -> None:
    stores = [await statekeel.open_store(nats_url) for _ in range(3)]
    try:
        entries = await asyncio.gather(
            *(s.audit.append("k", f"w{n}", "s", {"i": i}) for n, s in enumerate(stores) for i in range(15))
        )
        assert sorted(e.seq for e in entries) == list(range(1, 46))
        report = await stores[0].audit.verify()
        assert report.ok and report.count == 45
    finally:
        for s in stores:
            await s.close()


async def test_the_server_refuses_to_delete_or_purge_an_audit_entry(nats_url: str, js: Any) -> None:
    prefix = prefix_of(nats_url)
    async with statekeel.open_store(nats_url) as store:
        await store.audit.append("k", "a", "s", {"v": 1})
        with pytest.raises(nats.js.errors.APIError):
            await js.delete_msg(f"{prefix}_audit", 1)
        with pytest.raises(nats.js.errors.APIError):
            await js.purge_stream(f"{prefix}_audit")
        assert (await store.audit.verify()).count == 1


async def test_a_message_written_by_another_program_fails_verification_not_silently(
    nats_url: str, js: Any
) -> None:
    prefix = prefix_of(nats_url)
    async with statekeel.open_store(nats_url) as store:
        await store.audit.append("k", "a", "s", {"v": 1})
        await js.publish(f"{prefix}.audit.X", b'{"not": "an entry"}')
        with pytest.raises(statekeel.StorageCorrupt, match="not an audit entry"):
            await store.audit.verify()


async def test_session_keys_with_subject_syntax_round_trip_and_stay_apart(nats_url: str) -> None:
    keys = ["a.b", "a", "*", ">", "two words", "ünïcødé", "a.>"]
    async with statekeel.open_store(nats_url) as store:
        for key in keys:
            session = await store.sessions.get_or_create(key)
            session.add_message("user", f"hello {key}")
            await store.sessions.save(session)
        for key in keys:
            loaded = await store.backend.load_session_with_messages(key)
            assert loaded is not None and loaded[0].key == key
            assert [m.payload["content"] for m in loaded[1]] == [f"hello {key}"]
        listed = {r.key for r in (await store.backend.list_sessions()).items}
        assert listed == set(keys)


async def test_an_append_over_max_payload_is_payload_too_large_and_writes_no_message(nats_url: str) -> None:
    async with statekeel.open_store(nats_url) as store:
        backend: Any = store.backend
        await backend.append_messages("s", 0, [message(store, "first")], create=True)
        big = [message(store, "x" * (backend.conn.max_payload // 4)) for _ in range(5)]
        with pytest.raises(statekeel.PayloadTooLarge, match="max_payload"):
            await backend.append_messages("s", 1, big)
        record = await backend.load_session("s")
        assert record.head_seq == 1
        assert [m.seq for m in await backend.read_messages("s")] == [0]
        assert (await backend.append_messages("s", 1, [message(store, "next")])).head_seq == 2


async def test_an_append_whose_answer_was_lost_is_stored_once(
    nats_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with statekeel.open_store(nats_url) as store:
        backend: Any = store.backend
        await backend.append_messages("s", 0, [message(store, "a")], create=True)
        js = backend.conn.js
        real = js.publish
        lost: list[int] = []

        async def answer_lost_once(*args: Any, **kwargs: Any) -> Any:
            ack = await real(*args, **kwargs)
            if not lost and ".s." in args[0]:
                lost.append(ack.seq)
                raise nats.errors.TimeoutError
            return ack

        monkeypatch.setattr(js, "publish", answer_lost_once)
        record = await backend.append_messages("s", 1, [message(store, "b"), message(store, "c")])
        monkeypatch.setattr(js, "publish", real)
        assert lost and record.head_seq == 3
        backend._states.clear()  # read it back from the stream, not from this process's fold
        assert [m.payload["content"] for m in await backend.read_messages("s")] == ["a", "b", "c"]


async def test_two_stores_appending_to_one_session_never_interleave_or_lose_an_append(nats_url: str) -> None:
    stores = [await statekeel.open_store(nats_url) for _ in range(2)]
    try:
        await stores[0].backend.create_session("shared")

        async def writer(n: int, store: Store) -> list[int]:
            heads = []
            for i in range(10):
                while True:
                    record = await store.backend.load_session("shared")
                    assert record is not None
                    try:
                        pair = [message(store, f"w{n}-{i}-a"), message(store, f"w{n}-{i}-b")]
                        done = await store.backend.append_messages("shared", record.head_seq, pair)
                        heads.append(done.head_seq - 2)
                        break
                    except statekeel.ConflictError:
                        continue
            return heads

        starts = await asyncio.gather(writer(0, stores[0]), writer(1, stores[1]))
        rows = await stores[0].backend.read_messages("shared")
        assert [r.seq for r in rows] == list(range(40))
        texts = [r.payload["content"] for r in rows]
        for n, heads in enumerate(starts):
            for i, seq in enumerate(heads):
                assert texts[seq : seq + 2] == [f"w{n}-{i}-a", f"w{n}-{i}-b"]
    finally:
        for s in stores:
            await s.close()


async def test_a_deleted_session_is_gone_from_the_stream_and_its_lease_token_stays(nats_url: str) -> None:
    async with statekeel.open_store(nats_url) as store:
        backend: Any = store.backend
        lease = await backend.acquire_session_lease("s", "me", 30)
        await backend.append_messages("s", 0, [message(store, "a")], create=True, lease=lease)
        assert await backend.delete_session("s", lease=lease)
        backend._states.clear()
        assert await backend.load_session("s") is None
        assert (await backend.list_sessions()).items == []
        stream = f"{prefix_of(nats_url)}_sessions"
        assert await backend.conn.count(stream) == 1  # the tombstone alone
        again = await backend.acquire_session_lease("s", "other", 30)
        assert again.acquired is False and again.token == lease.token


async def test_forks_rewinds_and_usage_are_unsupported_on_a_plain_nats_store_and_write_nothing(
    nats_url: str,
) -> None:
    async with statekeel.open_store(nats_url) as store:
        session = await store.sessions.get_or_create("trunk")
        session.add_message("user", "one")
        session.add_message("user", "two")
        await store.sessions.save(session)
        with pytest.raises(statekeel.Unsupported, match="does not hold session forks") as raised:
            await store.sessions.fork("trunk", 1, new_key="retry")
        assert raised.value.kind == "sessions"
        assert await store.backend.load_session("retry") is None
        with pytest.raises(statekeel.Unsupported, match="does not hold session rewinds"):
            await store.sessions.rewind("trunk", 1, reason="try again")
        with pytest.raises(statekeel.Unsupported, match="does not hold session usage"):
            await store.sessions.usage("trunk")
        with pytest.raises(statekeel.Unsupported, match="does not hold session forks"):
            await store.sessions.branches("trunk")
        with pytest.raises(statekeel.Unsupported, match="does not hold session rewinds"):
            await store.sessions.rewinds("trunk")
        loaded = await store.sessions.load("trunk")
        assert loaded is not None and [m["content"] for m in loaded.messages] == ["one", "two"]
        assert loaded.head_seq == 2
        loaded.add_message("assistant", "priced", usage={"model": "m", "input_tokens": 1})
        with pytest.raises(statekeel.Unsupported, match="does not record usage"):
            await store.sessions.save(loaded)
        assert [m.seq for m in await store.backend.read_messages("trunk")] == [0, 1]


# --- leases: entries of the <prefix>_leases KV bucket, changed only by revision -----------------------


async def test_a_lease_is_a_kv_entry_that_is_changed_only_at_the_revision_read(
    nats_url: str, js: Any
) -> None:
    async with statekeel.open_store(nats_url) as store:
        backend = store.backend
        lease = await backend.acquire_session_lease("s.1 *", "A", 30)
        kv = await js.key_value(f"{prefix_of(nats_url)}_leases")
        key = encode_token("s.1 *")
        first = await kv.get(key)
        assert orjson.loads(first.value)["owner"] == "A" and orjson.loads(first.value)["token"] == 1
        renewed = await backend.renew_session_lease(lease, 60)
        second = await kv.get(key)
        assert second.revision > first.revision and renewed.token == lease.token
        # A writer holding the old revision fails, as a stale holder's renewal would.
        with pytest.raises(nats.js.errors.KeyWrongLastSequenceError):
            await kv.update(key, b"{}", last=first.revision)
        assert await backend.release_session_lease(renewed)
        assert orjson.loads((await kv.get(key)).value)["owner"] is None


async def test_holders_racing_for_one_lease_on_several_connections_get_it_once(nats_url: str) -> None:
    stores = [await statekeel.open_store(nats_url) for _ in range(4)]
    try:
        got = await asyncio.gather(
            *(s.backend.acquire_session_lease("race", f"holder-{i}", 30) for i, s in enumerate(stores))
        )
        winners = [g for g in got if g.acquired]
        assert len(winners) == 1 and winners[0].token == 1
        assert {g.owner for g in got} == {winners[0].owner}  # the others see who holds it
        assert await stores[0].backend.read_session_lease("race") == dataclasses.replace(
            winners[0], acquired=False
        )
    finally:
        for s in stores:
            await s.close()


async def test_a_write_checked_before_a_takeover_and_published_after_it_is_refused(
    nats_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with statekeel.open_store(nats_url) as old, statekeel.open_store(nats_url) as new:
        lease = await old.backend.acquire_session_lease("s", "old", 30)
        await old.backend.append_messages("s", 0, [message(old, "base")], create=True, lease=lease)
        backend: Any = old.backend
        check = backend._check_lease
        taken: list[Any] = []

        async def check_then_lose_it(key: str, held: Any) -> None:
            await check(key, held)  # the entry still names the old holder here...
            if not taken:  # ...and another process takes the lease over right after
                taken.append(await new.backend.acquire_session_lease("s", "new", 30, take_over=lease))

        monkeypatch.setattr(backend, "_check_lease", check_then_lose_it)
        with pytest.raises(statekeel.LeaseLost):
            await old.backend.append_messages("s", 1, [message(old, "zombie")], lease=lease)
        assert taken[0].acquired and taken[0].token == lease.token + 1
        assert [m.payload["content"] for m in await new.backend.read_messages("s")] == ["base"]
        await new.backend.append_messages("s", 1, [message(new, "mine")], lease=taken[0])


LEASE_HOLDER = """
import asyncio, sys, statekeel
from statekeel.backends.base import NewMessage

async def main(url):
    async with statekeel.open_store(url) as store:
        lease = await store.backend.acquire_session_lease("agent", "host-b|1|1|1|x", 1.0)
        body = store.codec.encode({"role": "user", "content": "before the kill"})
        await store.backend.append_messages("agent", 0, [NewMessage("user", body)], create=True, lease=lease)
        print(lease.token, flush=True)
        await asyncio.sleep(3600)  # never renews: killed before

asyncio.run(main(sys.argv[1]))
"""


async def test_a_holder_killed_with_sigkill_is_taken_over_after_its_lease_expires(nats_url: str) -> None:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", LEASE_HOLDER, nats_url, stdout=asyncio.subprocess.PIPE
    )
    assert proc.stdout is not None
    try:
        token = int((await asyncio.wait_for(proc.stdout.readline(), 60)).decode())
    finally:
        proc.kill()  # SIGKILL: nothing of the holder runs after this
        await proc.wait()
    async with statekeel.open_store(nats_url) as store:
        held = await store.backend.read_session_lease("agent")
        assert held is not None and held.owner == "host-b|1|1|1|x" and held.token == token
        refused = await store.backend.acquire_session_lease("agent", "me", 30)
        assert not refused.acquired or held.expires_at <= dt.datetime.now(dt.UTC)
        async with asyncio.timeout(10):
            while not (mine := await store.backend.acquire_session_lease("agent", "me", 30)).acquired:
                await asyncio.sleep(0.05)  # wait (with a deadline) for the dead holder's lease to expire
        assert mine.token == token + 1
        with pytest.raises(statekeel.LeaseLost):
            await store.backend.append_messages("agent", 1, [message(store, "zombie")], lease=held)
        await store.backend.append_messages("agent", 1, [message(store, "after")], lease=mine)
        texts = [m.payload["content"] for m in await store.backend.read_messages("agent")]
        assert texts == ["before the kill", "after"]


# --- atomic(): the writes of one session, one event ------------------------------------------------------


async def test_an_atomic_block_publishes_one_sessions_writes_as_one_event_at_its_end(nats_url: str) -> None:
    async with statekeel.open_store(nats_url) as store, statekeel.open_store(nats_url) as other:
        backend: Any = store.backend
        await backend.append_messages("s", 0, [message(store, "a")], create=True)
        stream = f"{prefix_of(nats_url)}_sessions"
        before = await backend.conn.count(stream)
        ended: list[bool] = []
        async with backend.atomic():
            await backend.append_messages("s", 1, [message(store, "b")])
            await backend.start_session_step("s", "c1", owner="me", expected_attempt=None)
            assert backend.on_block_end(ended.append)
            # The block reads its own writes; nothing is stored before it ends.
            assert (await backend.load_session("s")).head_seq == 2
            assert (await other.backend.load_session("s")).head_seq == 1
            assert await backend.conn.count(stream) == before
        assert ended == [True] and await backend.conn.count(stream) == before + 1
        assert (await other.backend.get_session_step("s", "c1")).status == "started"
        assert [m.payload["content"] for m in await other.backend.read_messages("s")] == ["a", "b"]


async def test_an_atomic_block_stores_nothing_when_it_raises_or_its_session_changed_meanwhile(
    nats_url: str,
) -> None:
    async with statekeel.open_store(nats_url) as store, statekeel.open_store(nats_url) as other:
        backend: Any = store.backend
        await backend.append_messages("s", 0, [message(store, "a")], create=True)
        ended: list[bool] = []
        with pytest.raises(RuntimeError):
            async with backend.atomic():
                backend.on_block_end(ended.append)
                await backend.append_messages("s", 1, [message(store, "lost")])
                raise RuntimeError("the caller failed")
        with pytest.raises(statekeel.ConflictError, match="nothing of the block was written"):
            async with backend.atomic():
                backend.on_block_end(ended.append)
                await backend.append_messages("s", 1, [message(store, "late")])
                await other.backend.append_messages("s", 1, [message(other, "first")])
        assert ended == [False, False]
        assert [m.payload["content"] for m in await backend.read_messages("s")] == ["a", "first"]


async def test_an_atomic_block_refuses_to_write_a_second_session_before_writing_it(nats_url: str) -> None:
    async with statekeel.open_store(nats_url) as store:
        backend: Any = store.backend
        with pytest.raises(statekeel.Unsupported, match="groups the writes of one session"):
            async with backend.atomic():
                await backend.create_session("one")
                await backend.create_session("two")
        assert await backend.load_session("one") is None and await backend.load_session("two") is None


async def test_a_plain_store_opens_for_its_own_kinds_and_refuses_another_when_it_is_opened(
    nats_url: str, tmp_path: Any
) -> None:
    async with statekeel.open_store(nats_url, fallback_dir=str(tmp_path)) as store:
        async with store.sessions.open("chat") as session:
            session.add_message("user", "hi")
        await store.audit.append("note", "me", "chat", {"n": 1})
        store.traces.record("t1", {"span_id": "s1", "name": "tool"})
        for manager in ("tasks", "workflows", "approvals", "memory", "files", "vectors"):
            assert not store.holds(manager)
            with pytest.raises(statekeel.Unsupported, match="rest=sqlite") as caught:
                getattr(store, manager)
            assert "sessions" in caught.value.holds  # type: ignore[attr-defined]
        info = await store.info()
        assert info.ok and info.counts is not None and info.counts.sessions["active"] == 1
        assert (await store.health()).ok
        report = await store.recover()
        assert report.ok and report.audit is not None and report.audit.count == 1
    # close() flushed the span: the store's own kinds were closed, the others never opened.
    async with statekeel.open_store(nats_url, fallback_dir=str(tmp_path)) as again:
        assert [s.span_id for s in await again.traces.get("t1")] == ["s1"]


async def test_a_stream_with_another_duplicate_window_is_refused_at_open(nats_url: str, js: Any) -> None:
    prefix = prefix_of(nats_url)
    async with statekeel.open_store(nats_url):
        pass
    config = (await js.stream_info(f"{prefix}_audit")).config
    await js.update_stream(dataclasses.replace(config, duplicate_window=1.0))
    with pytest.raises(statekeel.StorageCorrupt, match=rf"{prefix}_audit.*duplicate_window"):
        await statekeel.open_store(nats_url)


@pytest.mark.parametrize(
    "change",
    [
        {"max_msgs": 1},
        {"max_age": 3600.0},
        {"discard": nats.js.api.DiscardPolicy.NEW, "max_msgs": 1},
        {"duplicate_window": 1.0},
    ],
    ids=["max_msgs", "max_age", "discard", "duplicate_window"],
)
async def test_a_stream_changed_while_the_store_is_open_refuses_the_next_write_and_keeps_what_it_holds(
    nats_url: str, js: Any, change: dict[str, Any]
) -> None:
    prefix = prefix_of(nats_url)
    async with statekeel.open_store(nats_url) as store:
        await store.audit.append("k", "a", "s", {"n": 1})
        conn = store.backend.conn  # type: ignore[attr-defined]
        config = (await js.stream_info(f"{prefix}_audit")).config
        await js.update_stream(dataclasses.replace(config, **change))
        await asyncio.wait_for(conn.stream_changed.wait(), 10)  # the server's advisory reached the store
        with pytest.raises(
            statekeel.StorageCorrupt, match=rf"{prefix}_audit was changed.*nothing was written"
        ):
            await store.audit.append("k", "a", "s", {"n": 2})
        assert (await js.stream_info(f"{prefix}_audit")).state.messages == 1
        with pytest.raises(statekeel.StorageCorrupt):  # refused until the limits are restored
            await store.audit.append("k", "a", "s", {"n": 2})
        await js.update_stream(config)
        entry = await store.audit.append("k", "a", "s", {"n": 2})
        assert entry.seq == 2 and (await store.audit.verify()).ok
