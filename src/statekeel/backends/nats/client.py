"""The JetStream connection of a NATS store: its URL, its streams, subject tokens, scans, errors.

Every name statekeel maps into a subject (an audit subject, a trace or span id) becomes one subject token
in base32 (RFC 4648, upper case, no padding) of its UTF-8 bytes, so keys holding ``.``, ``*``, ``>``,
spaces or any other character round-trip exactly; the empty string is the token ``_``.
"""

from __future__ import annotations

import asyncio
import base64
import datetime as dt
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import nats
import nats.errors
import nats.js.errors
from nats.aio.client import Client
from nats.js import JetStreamContext
from nats.js.api import (
    AckPolicy,
    ConsumerConfig,
    DeliverPolicy,
    DiscardPolicy,
    RawStreamMsg,
    RetentionPolicy,
    StorageType,
    StreamConfig,
)

from ...errors import (
    BackendUnavailable,
    InvalidKey,
    PayloadTooLarge,
    StorageCorrupt,
)
from .url import NatsUrl, parse_nats_url

__all__ = [
    "NatsConnection",
    "NatsUrl",
    "StreamSpec",
    "decode_token",
    "encode_token",
    "parse_nats_url",
]  # NatsUrl and parse_nats_url are re-exported from .url

# Server-side errors of a conditional publish (JetStream's error codes).
WRONG_LAST_SEQUENCE = 10071
STREAM_NOT_FOUND = 10059

# The server announces every change of a stream's configuration here (the last token: the stream).
STREAM_UPDATED = "$JS.EVENT.ADVISORY.STREAM.UPDATED.*"

# A subject this long is refused before it is published (the server's control line is 4 KiB).
MAX_SUBJECT_BYTES = 1024


def encode_token(name: str) -> str:
    """``name`` as one subject token: base32 of its UTF-8 bytes, ``_`` for the empty string."""
    try:
        raw = name.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise InvalidKey(
            f"{name!r} cannot be mapped to a NATS subject: it is not valid Unicode text ({exc.reason})",
            key=name,
        ) from None
    if not raw:
        return "_"
    return base64.b32encode(raw).decode("ascii").rstrip("=")


def decode_token(token: str) -> str:
    """The name :func:`encode_token` mapped to ``token``."""
    if token == "_":
        return ""
    padded = token + "=" * (-len(token) % 8)
    try:
        return base64.b32decode(padded).decode("utf-8")
    except (ValueError, UnicodeDecodeError) as exc:
        raise StorageCorrupt(f"subject token {token!r} was not written by statekeel: {exc}") from None


def checked_subject(subject: str, what: str, value: str) -> str:
    if len(subject) > MAX_SUBJECT_BYTES:
        raise InvalidKey(
            f"{what} {value[:40]!r}… is too long to map to a NATS subject ({len(subject)} bytes encoded, "
            f"at most {MAX_SUBJECT_BYTES}); use a shorter {what}",
            key=value,
        )
    return subject


@dataclass(frozen=True, slots=True)
class StreamSpec:
    """A stream statekeel creates: the limits that its guarantees depend on."""

    name: str
    subjects: tuple[str, ...]
    max_msgs_per_subject: int = -1
    deny_delete: bool = False
    deny_purge: bool = False
    kv: bool = False  # a KV bucket's stream: no deletes, roll-ups for purging a key, direct gets

    def config(self, replicas: int) -> StreamConfig:
        return StreamConfig(
            name=self.name,
            subjects=list(self.subjects),
            retention=RetentionPolicy.LIMITS,
            storage=StorageType.FILE,
            discard=DiscardPolicy.NEW if self.kv else DiscardPolicy.OLD,
            max_msgs=-1,
            max_bytes=-1,
            max_age=0,
            max_msgs_per_subject=self.max_msgs_per_subject,
            max_msg_size=-1,
            num_replicas=replicas,
            duplicate_window=120.0,
            deny_delete=self.deny_delete or self.kv,
            deny_purge=self.deny_purge,
            allow_rollup_hdrs=self.kv,
            allow_direct=self.kv,
        )

    def differences(self, found: StreamConfig, replicas: int) -> list[str]:
        """What ``found`` (an existing stream's config) sets differently from what statekeel needs."""
        want = self.config(replicas)
        out: list[str] = []
        for name in (
            "subjects",
            "retention",
            "storage",
            "discard",
            "max_msgs",
            "max_bytes",
            "max_age",
            "max_msgs_per_subject",
            "max_msg_size",
            "num_replicas",
            "duplicate_window",
            "deny_delete",
            "deny_purge",
            "allow_rollup_hdrs",
            "sealed",
        ):
            have, need = _norm(getattr(found, name, None)), _norm(getattr(want, name, None))
            if have != need:
                out.append(f"{name}={have!r} (statekeel needs {need!r})")
        return out


def _norm(value: Any) -> Any:
    if isinstance(value, list):
        return sorted(value)
    if value is None:
        return None
    if hasattr(value, "value"):
        return value.value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if value is False:
        return False
    return value


def translate(exc: BaseException, what: str) -> BaseException:
    """A NATS client error as the statekeel error to raise (``exc`` itself when it is one already)."""
    if isinstance(exc, nats.errors.MaxPayloadError):
        return PayloadTooLarge(f"{what}: the message is larger than the NATS server's max_payload")
    if isinstance(exc, nats.js.errors.NotFoundError):
        return StorageCorrupt(f"{what}: {exc}")
    if isinstance(exc, (nats.errors.Error, OSError, asyncio.TimeoutError)):
        return BackendUnavailable(f"{what}: the NATS server did not answer ({type(exc).__name__}: {exc})")
    return exc


class NatsConnection:
    """One connection to the NATS servers of a store and its JetStream context."""

    def __init__(self, url: NatsUrl) -> None:
        self.url = url
        self._nc: Client | None = None
        self._js: JetStreamContext | None = None
        # The streams checked at open, and those the server said were changed since: a publish to one
        # of those re-reads its limits first (see docs/nats.md, "Stream limits").
        self._specs: dict[str, StreamSpec] = {}
        self._changed: set[str] = set()
        self.stream_changed = asyncio.Event()
        """Set when the server announces a change of a stream this connection checked (for tests)."""

    @property
    def js(self) -> JetStreamContext:
        if self._js is None:
            raise BackendUnavailable("the NATS store is not open (or was closed)")
        return self._js

    @property
    def max_payload(self) -> int:
        assert self._nc is not None
        return int(self._nc.max_payload)

    async def connect(self) -> None:
        """Connect to one of the URL's servers. Once connected the client reconnects by itself, without
        end; the first connection gives up after ``timeout`` seconds per server named (the client's own
        first connect would retry forever), raising ``BackendUnavailable`` naming the servers."""
        nc = Client()
        budget = self.url.timeout * len(self.url.servers)
        # Client.connect's annotations say int for what are seconds; it takes floats.
        options: dict[str, Any] = {"connect_timeout": self.url.timeout, "reconnect_time_wait": 0.2}
        try:
            await asyncio.wait_for(
                nc.connect(
                    servers=list(self.url.servers),
                    max_reconnect_attempts=-1,
                    allow_reconnect=True,
                    error_cb=_ignore,
                    disconnected_cb=_ignore_event,
                    reconnected_cb=_ignore_event,
                    closed_cb=_ignore_event,
                    **options,
                ),
                budget,
            )
        except Exception as exc:
            await nc.close()
            reason = f"none answered within {budget:g} s" if isinstance(exc, TimeoutError) else str(exc)
            raise BackendUnavailable(
                f"cannot connect to NATS at {', '.join(self.hosts)} ({type(exc).__name__}: {reason}); "
                "nothing was written"
            ) from exc
        self._nc = nc
        self._js = nc.jetstream(timeout=self.url.timeout)
        try:
            await nc.subscribe(STREAM_UPDATED, cb=self._on_stream_updated)
        except Exception as exc:
            await nc.close()
            raise translate(exc, "subscribing to the NATS stream advisories") from exc

    async def _on_stream_updated(self, msg: Any) -> None:
        name = str(msg.subject).rpartition(".")[2]
        if name in self._specs:
            self._changed.add(name)
            self.stream_changed.set()

    @property
    def hosts(self) -> list[str]:
        """The URL's servers as ``host:port``, without credentials, for messages."""
        return [s.partition("://")[2].rpartition("@")[2] for s in self.url.servers]

    async def close(self) -> None:
        nc, self._nc, self._js = self._nc, None, None
        if nc is not None and not nc.is_closed:
            # Bounded: the client's close waits for its socket to close, which has been seen to never
            # happen after a failed open; a close that never returns would hang the caller's shutdown.
            bound = max(self.url.timeout, 1.0) * 2
            try:
                await asyncio.wait_for(nc.drain(), bound)
            except Exception:
                try:
                    await asyncio.wait_for(nc.close(), bound)
                except TimeoutError:
                    hosts = ", ".join(self.hosts)
                    logging.getLogger(__name__).warning("NATS at %s did not close within %g s", hosts, bound)

    async def ensure_stream(self, spec: StreamSpec) -> None:
        """Create the stream if it is missing; refuse one created with other limits (nothing changed)."""
        js = self.js
        try:
            info = await js.stream_info(spec.name)
        except nats.js.errors.NotFoundError:
            try:
                await js.add_stream(spec.config(self.url.replicas))
            except nats.js.errors.APIError as exc:
                raise BackendUnavailable(
                    f"cannot create the NATS stream {spec.name}: {exc.description} (code {exc.err_code})",
                    stream=spec.name,
                ) from exc
            return
        except Exception as exc:
            raise translate(exc, f"reading the NATS stream {spec.name}") from exc
        else:
            self._refuse_changed(spec, info.config, "exists with limits statekeel did not set")
        finally:
            self._specs[spec.name] = spec

    async def recheck_stream(self, name: str, what: str) -> None:
        """Before a write to stream ``name`` after the server announced a change of its configuration:
        read it again and refuse the write (``StorageCorrupt``, nothing written) when its limits, discard
        policy or duplicate window are no longer what statekeel set."""
        spec = self._specs[name]
        self._changed.discard(name)  # a change announced while reading is announced again, and re-read
        try:
            info = await self.js.stream_info(name)
        except Exception as exc:
            self._changed.add(name)
            raise translate(exc, f"{what}: reading the NATS stream {name}") from exc
        try:
            self._refuse_changed(
                spec, info.config, "was changed while the store was open; nothing was written"
            )
        except StorageCorrupt:
            self._changed.add(name)  # refused again on every write until the limits are restored
            raise

    def _refuse_changed(self, spec: StreamSpec, found: StreamConfig, how: str) -> None:
        problems = spec.differences(found, self.url.replicas)
        if problems:
            raise StorageCorrupt(
                f"the NATS stream {spec.name} {how}: " + "; ".join(problems),
                stream=spec.name,
                differences=problems,
                hint=(
                    "statekeel left it as it was. Another program may own it: open the store with another "
                    "prefix= (nats://host:4222?prefix=NAME), or restore the stream's limits"
                ),
            )

    async def stream_problems(self, spec: StreamSpec) -> list[str]:
        """What is wrong with the stream now (missing, other limits); empty when it is as created."""
        try:
            info = await self.js.stream_info(spec.name)
        except nats.js.errors.NotFoundError:
            return [f"the NATS stream {spec.name} is missing"]
        return [f"{spec.name}: {p}" for p in spec.differences(info.config, self.url.replicas)]

    async def last_seq(self, stream: str) -> int:
        try:
            info = await self.js.stream_info(stream)
        except Exception as exc:
            raise translate(exc, f"reading the NATS stream {stream}") from exc
        return int(info.state.last_seq)

    async def count(self, stream: str, subjects: str | None = None) -> int:
        try:
            info = await self.js.stream_info(stream, subjects_filter=subjects)
        except Exception as exc:
            raise translate(exc, f"reading the NATS stream {stream}") from exc
        return int(info.state.messages)

    async def get(self, stream: str, seq: int) -> RawStreamMsg | None:
        try:
            return await self.js.get_msg(stream, seq=seq)
        except nats.js.errors.NotFoundError:
            return None
        except Exception as exc:
            raise translate(exc, f"reading message {seq} of the NATS stream {stream}") from exc

    async def last(self, stream: str, subject: str) -> RawStreamMsg | None:
        try:
            return await self.js.get_last_msg(stream, subject)
        except nats.js.errors.NotFoundError:
            return None
        except Exception as exc:
            raise translate(exc, f"reading the NATS stream {stream}") from exc

    async def purge(self, stream: str, subject: str, *, before_seq: int) -> None:
        """Remove ``subject``'s messages stored before ``before_seq`` (later ones stay)."""
        try:
            await self.js.purge_stream(stream, subject=subject, seq=before_seq)
        except Exception as exc:
            raise translate(exc, f"purging {subject} on the NATS stream {stream}") from exc

    async def scan(
        self, stream: str, subjects: str, *, start_seq: int = 1, limit: int | None = None
    ) -> AsyncIterator[tuple[int, str, bytes, dict[str, str]]]:
        """``(seq, subject, data, headers)`` of the stream's messages matching ``subjects`` from
        ``start_seq`` on, in sequence order, through a short-lived pull consumer (up to ``limit``).

        A consumer that cannot be made or read (a leader change, a reconnect) is made again from the
        message after the last one yielded; after a second failure the messages are read one by one
        from the stream's leader (no consumer needed), a few times, before ``BackendUnavailable``."""
        next_seq, left = max(1, start_seq), limit
        failures = 0
        while True:
            reader = self._scan_once if failures < 2 else self._scan_by_get
            try:
                async for item in reader(stream, subjects, next_seq, left):
                    next_seq = item[0] + 1
                    if left is not None:
                        left -= 1
                    failures = 0
                    yield item
                return
            except BackendUnavailable:
                failures += 1
                if failures >= 6:
                    raise
                await asyncio.sleep(0.2 * failures)

    async def _scan_by_get(
        self, stream: str, subjects: str, start_seq: int, limit: int | None
    ) -> AsyncIterator[tuple[int, str, bytes, dict[str, str]]]:
        seq, left = start_seq, limit
        while left is None or left > 0:
            try:
                msg = await self.js.get_msg(stream, seq=seq, subject=subjects, next=True)
            except nats.js.errors.NotFoundError:
                return
            except Exception as exc:
                raise translate(exc, f"reading the NATS stream {stream}") from exc
            assert msg.seq is not None and msg.subject is not None
            yield msg.seq, msg.subject, msg.data or b"", dict(msg.headers or {})
            seq = msg.seq + 1
            if left is not None:
                left -= 1

    async def _scan_once(
        self, stream: str, subjects: str, start_seq: int, limit: int | None
    ) -> AsyncIterator[tuple[int, str, bytes, dict[str, str]]]:
        js = self.js
        config = ConsumerConfig(
            ack_policy=AckPolicy.NONE,
            deliver_policy=DeliverPolicy.BY_START_SEQUENCE,
            opt_start_seq=start_seq,
            filter_subject=subjects,
            inactive_threshold=30.0,
            mem_storage=True,
            num_replicas=1,
        )
        try:
            sub = await js.pull_subscribe(subjects, stream=stream, config=config)
        except Exception as exc:
            raise translate(exc, f"reading the NATS stream {stream}") from exc
        try:
            try:
                info = await sub.consumer_info()
            except Exception as exc:
                raise translate(exc, f"reading the NATS stream {stream}") from exc
            remaining = int(info.num_pending or 0)
            if limit is not None:
                remaining = min(remaining, limit)
            while remaining > 0:
                try:
                    batch = await sub.fetch(min(remaining, 512), timeout=self.url.timeout)
                except Exception as exc:
                    raise translate(exc, f"reading the NATS stream {stream}") from exc
                for msg in batch:
                    meta = msg.metadata
                    remaining -= 1
                    yield int(meta.sequence.stream), msg.subject, msg.data, dict(msg.headers or {})
                    if remaining <= 0:
                        break
        finally:
            try:
                await sub.unsubscribe()
            except Exception:
                pass  # the consumer goes away by itself (inactive_threshold)

    async def publish(
        self,
        subject: str,
        payload: bytes,
        *,
        stream: str,
        headers: dict[str, str],
        what: str,
        attempts: int = 3,
    ) -> tuple[int, bool]:
        """Publish ``payload``; ``(seq, duplicate)``. An answer lost (timeout, reconnect) is retried with
        the same ``Nats-Msg-Id`` header, which the stream deduplicates: the message is stored once.
        ``nats.js.errors.APIError`` of the server (a failed expectation) is raised as it is."""
        self.check_size(subject, payload, headers, what)
        if stream in self._changed:
            await self.recheck_stream(stream, what)
        last: BaseException | None = None
        maybe_stored = False  # a timeout or a closed connection: the server may have stored it
        for _ in range(attempts):
            try:
                ack = await self.js.publish(subject, payload, stream=stream, headers=dict(headers))
                return int(ack.seq), bool(ack.duplicate)
            except nats.js.errors.APIError:
                raise
            except (TimeoutError, nats.errors.TimeoutError, nats.errors.ConnectionClosedError) as exc:
                last = exc
                maybe_stored = True
                if "Nats-Msg-Id" not in headers:
                    break
                await asyncio.sleep(0.1)
            except nats.js.errors.NoStreamResponseError as exc:
                last = exc
                await asyncio.sleep(0.2)
            except Exception as exc:
                raise translate(exc, what) from exc
        assert last is not None
        if not maybe_stored:  # no stream answered at all: nothing was stored
            raise BackendUnavailable(
                f"{what}: no NATS stream answered ({type(last).__name__}); nothing was stored",
                write_id=headers.get("Nats-Msg-Id"),
            )
        # Stored perhaps, though its ack never came: unknown until a read settles it (a session's next
        # save or load finds its write id in the event), never a definite failure.
        raise BackendUnavailable(
            f"{what}: the NATS server did not acknowledge the message ({type(last).__name__}); it may or "
            "may not be stored: re-read before retrying it",
            write_id=headers.get("Nats-Msg-Id"),
            outcome="unknown",
            hint="",
        )

    def check_size(self, subject: str, payload: bytes, headers: dict[str, str], what: str) -> None:
        size = len(payload) + len(subject) + sum(len(k) + len(v) + 4 for k, v in headers.items()) + 64
        limit = self.max_payload
        if size > limit:
            raise PayloadTooLarge(
                f"{what}: {len(payload)} bytes is over the NATS server's max_payload of {limit} bytes; "
                "nothing was written",
                size=len(payload),
                limit=limit,
                hint="Store a smaller record, or raise max_payload in the NATS server's configuration",
            )


def _micros(at: dt.datetime) -> int:
    delta = at.astimezone(dt.UTC) - dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
    return (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds


def micros(at: dt.datetime) -> int:
    """An aware datetime as integer microseconds since the epoch."""
    return _micros(at)


def from_micros(value: int) -> dt.datetime:
    return dt.datetime(1970, 1, 1, tzinfo=dt.UTC) + dt.timedelta(microseconds=value)


async def _ignore(exc: Exception) -> None:
    """The client's own error callback: statekeel reports errors where a call fails, not here."""


async def _ignore_event() -> None:
    """Connection events: the client reconnects by itself; a call that fails meanwhile raises."""
