"""Google ADK sessions on a statekeel store: :class:`StatekeelSessionService`, a ``BaseSessionService``.

One line to adopt it (``pip install 'statekeel[adk]'``)::

    from statekeel.integrations.adk import StatekeelSessionService

    service = StatekeelSessionService("sqlite:///agent.db")        # or memory://, postgresql://…
    runner = Runner(agent=agent, app_name="shop", session_service=service)

An ADK session is the statekeel session ``adk/<app>/<user>/<session id>`` (each part percent-encoded):
its events are the session's messages, one ``{"role": "adk_event", "event": {...}}`` each, append-only,
and its state is in the session's metadata. ``app:`` state lives in the session ``adk-app/<app>``,
``user:`` state in ``adk-user/<app>/<user>``, with ADK's semantics: shared by every session of the app (or
of the user), returned merged with their prefixes; ``temp:`` state is applied to the in-memory session for
the rest of the invocation and never stored.

``append_event`` is one transaction (the event, and the state it changes in every scope) under the
session's lock; a session object older than what the store holds — another writer appended since it was
read — raises :class:`StaleSession` (ADK's ``StaleSessionError``, and a statekeel ``ConflictError``):
two writers on one session conflict, never interleave. Function calls a process that is gone (killed
inside a tool) left without a response are answered with an interrupted response when the session is next
read, so that the next model call is valid.

ADK's rewind (``Runner.rewind_async``, which appends an event whose ``rewind_before_invocation_id`` names
an invocation) is a statekeel rewind (``sessions.rewind``): in the append's transaction, the events from
that invocation's first one on leave the live transcript for a rewind record (``store.sessions.rewinds``
and ``archived`` read them), then the rewind event and the state it restores are appended.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from typing import Any
from urllib.parse import quote, unquote

try:
    from google.adk.errors.already_exists_error import AlreadyExistsError
    from google.adk.errors.session_not_found_error import SessionNotFoundError
    from google.adk.events.event import Event
    from google.adk.sessions.base_session_service import (
        BaseSessionService,
        GetSessionConfig,
        ListSessionsResponse,
    )
    from google.adk.sessions.session import Session
    from google.adk.sessions.state import State
    from google.genai import types
except ImportError as exc:  # an optional extra
    raise ImportError(
        f"statekeel.integrations.adk needs Google ADK: pip install 'statekeel[adk]' ({exc})"
    ) from exc

try:  # ADK's own error for a stale session (recent versions)
    from google.adk.errors import StaleSessionError as _AdkStale
except ImportError:  # pragma: no cover - older ADK: a ValueError, as it is there
    _AdkStale = ValueError  # type: ignore[assignment,misc]

from ..errors import ConflictError, InvalidConfig, NotFound, SerializationError, UnserializableValue
from ..holders import holder_is_dead
from ..sessions import Session as StoredSession
from ..store import Store, open_store
from ..transcripts import INTERRUPTED_TEXT
from ..validation import check_key

log = logging.getLogger("statekeel.integrations.adk")

EVENT_ROLE = "adk_event"
_STATE = "adk.state"  # the session's own state, in its metadata
_UPDATED = "adk.last_update_time"
# The function calls still waiting for their response: {call id: [name, author, invocation id]}, and the
# process whose run made them (a call of a process that is gone is answered as interrupted).
_OPEN = "adk.open_calls"
_OWNER = "adk.calls_owner"
_IDS = ("app_name", "user_id", "session_id")


class SessionExists(ConflictError, AlreadyExistsError):
    """``create_session`` with the id of a session that exists (ADK's ``AlreadyExistsError``)."""

    hint = "Pick another session_id, or get_session the one that exists."


class StaleSession(ConflictError, _AdkStale):
    """``append_event`` on a session object another writer appended to since it was read (ADK's
    ``StaleSessionError``). Nothing was written."""

    hint = "Another writer appended first: get_session again and re-apply the event."


class SessionMissing(NotFound, SessionNotFoundError):
    """``append_event`` on a session that does not exist (ADK's ``SessionNotFoundError``)."""


def _part(value: Any, what: str) -> str:
    if type(value) is not str or not value.strip():
        raise InvalidConfig(f"{what} must be a non-empty str, got {value!r}", value=value)
    return quote(value.strip(), safe="")


def _key(app_name: Any, user_id: Any, session_id: Any) -> str:
    parts = [_part(v, w) for v, w in zip((app_name, user_id, session_id), _IDS, strict=True)]
    return check_key("adk/" + "/".join(parts), "session key")


def _user_key(app_name: str, user_id: str) -> str:
    return f"adk-user/{_part(app_name, 'app_name')}/{_part(user_id, 'user_id')}"


def _app_key(app_name: str) -> str:
    return f"adk-app/{_part(app_name, 'app_name')}"


def _split(state: dict[str, Any] | None) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    """A state or state delta as (app, user, session) parts, prefixes stripped; ``temp:`` keys dropped."""
    app: dict[str, Any] = {}
    user: dict[str, Any] = {}
    own: dict[str, Any] = {}
    for key, value in (state or {}).items():
        if key.startswith(State.APP_PREFIX):
            app[key.removeprefix(State.APP_PREFIX)] = value
        elif key.startswith(State.USER_PREFIX):
            user[key.removeprefix(State.USER_PREFIX)] = value
        elif not key.startswith(State.TEMP_PREFIX):
            own[key] = value
    return app, user, own


def _track_calls(stored: StoredSession, event: Event, owner: str) -> None:
    """Keep the session's waiting function calls up to date with ``event`` (in its metadata)."""
    calls = event.get_function_calls()
    answered = {r.id for r in event.get_function_responses() if r.id}
    waiting = stored.metadata.get(_OPEN)
    waiting = dict(waiting) if isinstance(waiting, dict) else {}
    if not calls and not (answered & set(waiting)):
        return
    for call in calls:
        if call.id:
            waiting[call.id] = [call.name or "", event.author, event.invocation_id]
    for call_id in answered:
        waiting.pop(call_id, None)
    if waiting:
        stored.metadata[_OPEN] = waiting
        stored.metadata[_OWNER] = owner
    else:
        stored.metadata.pop(_OPEN, None)
        stored.metadata.pop(_OWNER, None)


def _rewind_point(stored: StoredSession, invocation_id: str | None) -> int | None:
    """The seq of the first live event of ``invocation_id`` (an ADK rewind goes back to before it), or
    None: no rewind, or none of that invocation's events is in the live transcript (then ADK's own rule,
    which skips the events of a rewound invocation when it reads them, is all there is to do)."""
    if not invocation_id:
        return None
    for i, m in enumerate(stored.messages):
        if m.get("role") == EVENT_ROLE and m.get("event", {}).get("invocationId") == invocation_id:
            return stored.head_seq - len(stored.messages) + i
    return None


def _state_of(session: StoredSession | None) -> dict[str, Any]:
    if session is None:
        return {}
    value = session.metadata.get(_STATE)
    return dict(value) if isinstance(value, dict) else {}


class StatekeelSessionService(BaseSessionService):
    """Google ADK's session service on a statekeel store (SQLite, ``memory://`` or PostgreSQL).

    ``StatekeelSessionService(url)`` opens the store on first use (``await service.aclose()`` closes it);
    ``StatekeelSessionService(store)`` uses a store the application opened and closes. ``open_store``
    options pass as keywords with a URL. See the module docstring for the storage and the semantics.
    """

    def __init__(
        self, store: str | Store, *, lock_timeout: float | None = None, **store_options: Any
    ) -> None:
        if lock_timeout is not None and (type(lock_timeout) not in (int, float) or not lock_timeout >= 0):
            raise InvalidConfig(f"lock_timeout must be None or a number >= 0, got {lock_timeout!r}")
        self.lock_timeout = lock_timeout
        self._store: Store | None = None
        self._opener: Any = None
        if isinstance(store, Store):
            if store_options:
                raise InvalidConfig("open_store options apply to a URL, not to an open store")
            self._store = store
        elif isinstance(store, str):
            self._opener = open_store(store, **store_options)  # a bad URL or option fails here
        else:
            raise InvalidConfig(
                f"StatekeelSessionService needs a store URL or an open statekeel Store, got "
                f"{type(store).__name__}"
            )

    async def store(self) -> Store:
        """The statekeel store (opened on first use when the service was made from a URL)."""
        if self._store is None:
            self._store = await self._opener
        return self._store

    async def aclose(self) -> None:
        """Close the store if this service opened it (from a URL)."""
        if self._opener is not None and self._store is not None:
            store, self._store = self._store, None
            await store.close()

    @asynccontextmanager
    async def _locked(self, *keys: str) -> AsyncIterator[Store]:
        """The store, with the locks of ``keys`` held (always taken in one order: no deadlock)."""
        store = await self.store()
        async with AsyncExitStack() as stack:
            for key in sorted(set(keys)):
                lock = store.sessions.lock(key)
                await lock.acquire(self.lock_timeout)
                stack.push_async_callback(lock.release)
            yield store

    async def _scoped(
        self, store: Store, app_name: str, user_id: str
    ) -> tuple[dict[str, Any], dict[str, Any]]:
        app = await store.sessions.load(_app_key(app_name), repair=False)
        user = await store.sessions.load(_user_key(app_name, user_id), repair=False)
        return _state_of(app), _state_of(user)

    def _session(
        self,
        stored: StoredSession,
        app_name: str,
        user_id: str,
        session_id: str,
        scoped: tuple[dict[str, Any], dict[str, Any]],
        events: list[Event],
    ) -> Session:
        state = _state_of(stored)
        app, user = scoped
        state.update({State.APP_PREFIX + k: v for k, v in app.items()})
        state.update({State.USER_PREFIX + k: v for k, v in user.items()})
        updated = stored.metadata.get(_UPDATED)
        return Session(
            id=session_id,
            app_name=app_name,
            user_id=user_id,
            state=state,
            events=events,
            last_update_time=float(updated) if isinstance(updated, int | float) else 0.0,
        )

    # --- BaseSessionService -------------------------------------------------------------------------

    async def _answer_abandoned_calls(self, store: Store, key: str) -> StoredSession | None:
        """Answer, once and under the session's lock, the function calls a process that is gone left
        without a response: an event with an interrupted response each, so that the next model call is
        valid. Returns the session as saved (None when it is gone or another writer answered first)."""
        async with self._locked(key):
            stored = await store.sessions.load(key, repair=False)
            if stored is None:
                return None
            waiting = stored.metadata.get(_OPEN)
            if (
                not isinstance(waiting, dict)
                or not waiting
                or not holder_is_dead(stored.metadata.get(_OWNER))
            ):
                return stored
            by_author: dict[tuple[str, str], list[Any]] = {}
            for call_id, (name, author, invocation) in waiting.items():
                response = types.FunctionResponse(id=call_id, name=name, response={"error": INTERRUPTED_TEXT})
                by_author.setdefault((author, invocation), []).append(types.Part(function_response=response))
            stamp = float(stored.metadata.get(_UPDATED) or 0.0)
            for (author, invocation), parts in by_author.items():
                answer = Event(
                    author=author,
                    invocation_id=invocation,
                    content=types.Content(role="user", parts=parts),
                    timestamp=max(time.time(), stamp),
                )
                stored.add_item(
                    {
                        "role": EVENT_ROLE,
                        "event": answer.model_dump(mode="json", by_alias=True, exclude_none=True),
                    }
                )
                stamp = answer.timestamp
            stored.metadata.pop(_OPEN, None)
            stored.metadata.pop(_OWNER, None)
            stored.metadata[_UPDATED] = stamp
            await self._save(store, [stored])
            log.warning(
                "ADK session %r: %d function call(s) left without a response by a process that is gone "
                "answered as interrupted: %s",
                key,
                len(waiting),
                ", ".join(waiting),
            )
            return stored

    async def create_session(
        self,
        *,
        app_name: str,
        user_id: str,
        state: dict[str, Any] | None = None,
        session_id: str | None = None,
    ) -> Session:
        """A new session (``SessionExists`` if ``session_id`` is taken); ``state``'s ``app:`` and ``user:``
        keys go to their scopes, ``temp:`` keys are dropped. One transaction."""
        sid = session_id.strip() if isinstance(session_id, str) and session_id.strip() else str(uuid.uuid4())
        key = _key(app_name, user_id, sid)
        if state is not None and not isinstance(state, dict):
            raise InvalidConfig(f"state must be a dict or None, got {type(state).__name__}")
        app, user, own = _split(state)
        keys = [
            key,
            *([_app_key(app_name)] if app else []),
            *([_user_key(app_name, user_id)] if user else []),
        ]
        async with self._locked(*keys) as store:
            if await store.sessions.load(key, repair=False) is not None:
                raise SessionExists(
                    f"session {sid!r} of user {user_id!r} in app {app_name!r} exists", key=key
                )
            now = time.time()
            stored = await store.sessions.get_or_create(key, repair=False)
            stored.metadata.update({_STATE: own, _UPDATED: now})
            await self._save(store, [stored, *await self._scope_updates(store, app_name, user_id, app, user)])
            return self._session(
                stored, app_name, user_id, sid, await self._scoped(store, app_name, user_id), []
            )

    async def _scope_updates(
        self, store: Store, app_name: str, user_id: str, app: dict[str, Any], user: dict[str, Any]
    ) -> list[StoredSession]:
        changed = []
        for key, delta in ((_app_key(app_name), app), (_user_key(app_name, user_id), user)):
            if delta:
                scope = await store.sessions.get_or_create(key, repair=False)
                merged = _state_of(scope)
                merged.update(delta)
                scope.metadata[_STATE] = merged
                changed.append(scope)
        return changed

    async def _save(self, store: Store, sessions: list[StoredSession]) -> None:
        """Save ``sessions`` in one transaction; a value the codec refuses is ``UnserializableValue``."""
        try:
            for s in sessions:
                store.codec.encode(s.metadata, where="state")
            async with store.backend.atomic():
                for s in sessions:
                    await store.sessions.save(s)
        except SerializationError as exc:
            for s in sessions:
                store.sessions.discard(s.key, s)  # its unsaved change must not reach a later save
            if type(exc) is not SerializationError:
                raise
            raise UnserializableValue(exc.message) from None
        except BaseException:
            for s in sessions:
                store.sessions.discard(s.key, s)
            raise

    async def get_session(
        self,
        *,
        app_name: str,
        user_id: str,
        session_id: str,
        config: GetSessionConfig | None = None,
    ) -> Session | None:
        """The session with its events (the latest ``config.num_recent_events``, those at or after
        ``config.after_timestamp``) and its state merged with the app's and the user's; None if none."""
        key = _key(app_name, user_id, session_id)
        store = await self.store()
        stored = await store.sessions.load(key, repair=False)
        if stored is None:
            return None
        if stored.metadata.get(_OPEN) and holder_is_dead(stored.metadata.get(_OWNER)):
            stored = await self._answer_abandoned_calls(store, key) or stored
        raw = [m["event"] for m in stored.messages if m.get("role") == EVENT_ROLE]
        if config is not None:  # filtered before decoding: only the events returned are validated
            if config.num_recent_events is not None:
                raw = raw[-config.num_recent_events :] if config.num_recent_events else []
            if config.after_timestamp is not None:
                after = config.after_timestamp
                raw = [e for e in raw if e.get("timestamp", 0) >= after]
        events = [Event.model_validate(e) for e in raw]
        scoped = await self._scoped(store, app_name, user_id)
        return self._session(stored, app_name, user_id, session_id.strip(), scoped, events)

    async def list_sessions(self, *, app_name: str, user_id: str | None = None) -> ListSessionsResponse:
        """The sessions of the app (of one user when ``user_id`` is given), without events, oldest update
        first, their state merged with the app's and the user's."""
        prefix = f"adk/{_part(app_name, 'app_name')}/"
        if user_id is not None:
            prefix += f"{_part(user_id, 'user_id')}/"
        store = await self.store()
        found: list[Session] = []
        scopes: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {}
        async for record in store.sessions.iter():
            if not record.key.startswith(prefix):
                continue
            _, _, uid, sid = (unquote(p) for p in record.key.split("/"))
            stored = await store.sessions.load(record.key, repair=False)
            if stored is None:
                continue  # deleted meanwhile
            if uid not in scopes:
                scopes[uid] = await self._scoped(store, app_name, uid)
            found.append(self._session(stored, app_name, uid, sid, scopes[uid], []))
        found.sort(key=lambda s: (s.last_update_time, s.user_id, s.id))
        return ListSessionsResponse(sessions=found)

    async def delete_session(self, *, app_name: str, user_id: str, session_id: str) -> None:
        """Delete the session and its events (nothing if it does not exist); app and user state stay."""
        key = _key(app_name, user_id, session_id)
        async with self._locked(key) as store:
            await store.sessions.delete(key)

    async def get_user_state(self, *, app_name: str, user_id: str) -> dict[str, Any]:
        """The user's ``user:`` state, keys without the prefix."""
        return (await self._scoped(await self.store(), app_name, user_id))[1]

    async def append_event(self, session: Session, event: Event) -> Event:
        """Append ``event`` and apply its state delta, in one transaction under the session's lock.

        ``temp:`` keys are applied to ``session`` only. An event already stored (same id) is not stored
        again. ``StaleSession`` when another writer appended since ``session`` was read,
        ``SessionMissing`` when the session does not exist; nothing is written then."""
        if event.partial:
            return event
        key = _key(session.app_name, session.user_id, session.id)
        self._apply_temp_state(session, event)
        event = self._trim_temp_delta_state(event)
        app, user, own = _split(event.actions.state_delta if event.actions else None)
        keys = [key, *([_app_key(session.app_name)] if app else [])]
        keys += [_user_key(session.app_name, session.user_id)] if user else []
        async with self._locked(*keys) as store:
            stored = await store.sessions.load(key, repair=False)
            if stored is None:
                raise SessionMissing(f"session {session.id!r} not found", key=key)
            if any(m.get("event", {}).get("id") == event.id for m in stored.messages[-64:]):
                return event  # stored already (a retried append)
            updated = stored.metadata.get(_UPDATED)
            if isinstance(updated, int | float) and updated > session.last_update_time:
                raise StaleSession(
                    f"session {session.id!r} was appended to by another writer since this session object "
                    f"was read (stored update {updated}, this object's {session.last_update_time})",
                    key=key,
                )
            try:
                payload = event.model_dump(mode="json", by_alias=True, exclude_none=True)
            except Exception as exc:
                raise UnserializableValue(f"event {event.id!r} cannot be serialized: {exc}") from exc
            target = event.actions.rewind_before_invocation_id if event.actions else None
            at = _rewind_point(stored, target)
            # The rewind (the invocation's events and all after it leave the live transcript for a rewind
            # record), the rewind event and the state it restores: one transaction.
            async with store.backend.atomic():
                if at is not None:
                    await store.sessions.rewind(key, at, reason=f"ADK rewind before invocation {target}")
                    if stored.head_seq != at:  # the cached session was not brought along: read it again
                        again = await store.sessions.load(key, repair=False)
                        assert again is not None  # its row is locked by this transaction
                        stored = again
                stored.add_item({"role": EVENT_ROLE, "event": payload})
                _track_calls(stored, event, store.sessions.owner_id)
                state = _state_of(stored)
                state.update(own)
                stored.metadata[_STATE] = state
                stamp = max(event.timestamp, float(updated) if isinstance(updated, int | float) else 0.0)
                stored.metadata[_UPDATED] = stamp
                scopes = await self._scope_updates(store, session.app_name, session.user_id, app, user)
                await self._save(store, [stored, *scopes])
        if at is not None:
            # As the store now holds it: the rewound events are no longer the session's.
            first = next((i for i, e in enumerate(session.events) if e.invocation_id == target), None)
            if first is not None:
                del session.events[first:]
        self._commit_event_to_session(session, event)
        session.last_update_time = stamp
        return event


__all__ = ["EVENT_ROLE", "SessionExists", "SessionMissing", "StaleSession", "StatekeelSessionService"]
