"""The ``Store`` facade: opens a backend from a URL and hands out the managers.

store = await statekeel.open_store("sqlite:///agent-state.db")
...
await store.close()

async with statekeel.open_store("memory://") as store:
    ...
"""

from __future__ import annotations

import asyncio
import datetime as dt
import os
from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar, overload
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from .approvals import ApprovalLog
from .audit import AuditLog
from .backends.base import KIND_CONTRACTS, Incident, StateCounts, StorageBackend
from .backends.nats.url import PAIRED_KINDS, parse_nats_url
from .backup import BackupReport, backup
from .chain import check_audit_key
from .codec import DEFAULT_MAX_RECORD_BYTES, Codec
from .codec.encryption import RotationProgress, RotationReport, check_keys, make_cipher, rotate
from .erasure import ErasureReport, erase
from .errors import InvalidArgument, NotFound, StorageCorrupt, Unsupported
from .fallback import default_dir as default_fallback_dir
from .files import FileLedger
from .health import HealthReport, StoreInfo, health
from .memory import MemoryStore
from .recovery import RecoveryReport, recover
from .retention import PurgeReport, Retention, purge
from .schedules import ScheduleManager
from .sessions import SessionManager
from .tasks import TaskManager
from .traces import TraceLog
from .validation import check_bool, check_int, check_key
from .vectors import VectorIndex
from .workflows import WorkflowEngine


@dataclass(frozen=True, slots=True)
class StoreOptions:
    """``open_store`` options, validated. Each has a safe default."""

    fallback_dir: str | None = None
    cache_size: int = 200
    durability: str = "normal"
    busy_timeout_ms: int = 5000
    max_record_bytes: int = DEFAULT_MAX_RECORD_BYTES
    # Never in a repr (logs, tracebacks): the keys are the secret.
    encryption_key: bytes | tuple[bytes, ...] | None = field(default=None, repr=False)
    encrypt_existing: bool = False
    # The key ring of per-subject data keys (statekeel.codec.keyring): a file outside the database's backups.
    keyring: str | os.PathLike[str] | None = None
    migrate: bool = True
    audit_key: bytes | None = None
    retention: Retention = field(default_factory=Retention)

    def __post_init__(self) -> None:
        check_int(self.cache_size, "cache_size", minimum=1)
        check_int(self.busy_timeout_ms, "busy_timeout_ms", minimum=0)
        check_int(self.max_record_bytes, "max_record_bytes", minimum=1)
        if self.durability not in ("normal", "full"):
            raise InvalidArgument(f"durability must be 'normal' or 'full', got {self.durability!r}")
        if self.fallback_dir is not None and not isinstance(self.fallback_dir, (str, os.PathLike)):
            raise InvalidArgument(f"fallback_dir must be a path, got {type(self.fallback_dir).__name__}")
        check_bool(self.migrate, "migrate")
        if not isinstance(self.retention, Retention):
            raise InvalidArgument(f"retention must be a statekeel.Retention, got {self.retention!r}")
        check_bool(self.encrypt_existing, "encrypt_existing")
        if self.encryption_key is not None:
            check_keys(self.encryption_key)
        elif self.encrypt_existing:
            raise InvalidArgument("encrypt_existing=True needs an encryption_key to encrypt with")
        if self.keyring is not None:
            if not isinstance(self.keyring, (str, os.PathLike)):
                raise InvalidArgument(f"keyring must be a path, got {type(self.keyring).__name__}")
            if self.encryption_key is None:
                raise InvalidArgument(
                    "keyring needs an encryption_key: the store key wraps the ring's data keys"
                )
        check_audit_key(self.audit_key)


DEFAULT_URL = "sqlite:///statekeel.db"
"""The store ``open_store()`` and the ``statekeel`` command use when given no URL and ``$STATEKEEL_URL`` is
unset or empty."""

# SQLAlchemy's spellings of a PostgreSQL URL for asyncpg, which asyncpg itself does not accept.
_PG_ALIASES = ("postgresql+asyncpg", "postgres+asyncpg")


def resolve_url(url: str | None = None) -> str:
    """The store URL to use: ``url``, else ``$STATEKEEL_URL``, else ``sqlite:///statekeel.db``; a
    ``postgresql+asyncpg://`` URL (SQLAlchemy's spelling) becomes ``postgresql://``.

    resolve_url(None)  # 'sqlite:///statekeel.db' when $STATEKEEL_URL is not set
    """
    if url is None:
        url = os.environ.get("STATEKEEL_URL") or DEFAULT_URL
    if not isinstance(url, str):
        raise InvalidArgument(f"store URL must be a str, got {type(url).__name__}")
    scheme, sep, rest = url.partition("://")
    if sep and scheme.lower() in _PG_ALIASES:
        return "postgresql://" + rest
    return url


def redact_url(url: str) -> str:
    """``url`` without its password (``user:password@`` or ``?password=``, both accepted by asyncpg)."""
    parts = urlsplit(url)
    query = parse_qsl(parts.query, keep_blank_values=True)
    in_query = any(name == "password" for name, _ in query)
    if parts.password is None and not in_query:
        return url  # unchanged: a split/unsplit round trip would drop sqlite:////'s empty host
    if parts.password is not None:
        host = parts.netloc.rpartition("@")[2]
        parts = parts._replace(netloc=f"{parts.username or ''}:***@{host}")
    if in_query:
        hidden = [(name, "***" if name == "password" else value) for name, value in query]
        parts = parts._replace(query=urlencode(hidden, safe="*"))
    return urlunsplit(parts)


def sqlite_path(url: str) -> str | None:
    """The file path of a ``sqlite:///`` URL, or None for ``memory://``. Raises for other schemes."""
    parts = urlsplit(url)
    if parts.scheme == "memory":
        if url != "memory://":
            raise InvalidArgument(f"an in-memory store is opened with exactly memory://, got {url!r}")
        return None
    if parts.scheme != "sqlite":
        raise InvalidArgument(f"not a SQLite URL: {url!r}")
    if "?" in url or "#" in url:
        # Silently dropped, a query would lose the caller's options and a '#' would name another file.
        raise InvalidArgument(
            f"SQLite URL {url!r} has a query string or fragment ('?' or '#'); pass options as keyword "
            "arguments of open_store (durability=..., busy_timeout_ms=...) and use a file name without "
            "'?' or '#'"
        )
    if parts.netloc:
        raise InvalidArgument(
            f"SQLite URL {url!r} has a host part; use sqlite:///relative.db or sqlite:////absolute/path.db"
        )
    path = parts.path[1:] if parts.path.startswith("/") else parts.path
    if not path:
        raise InvalidArgument(f"SQLite URL {url!r} names no file; use sqlite:///relative.db")
    return path


def sqlite_file(url: str) -> str | None:
    """The file path of a ``sqlite:///`` URL; None for a URL of any other scheme (no file of its own)."""
    return sqlite_path(url) if urlsplit(url).scheme == "sqlite" else None


def make_backend(url: str, options: StoreOptions, codec: Codec) -> StorageBackend:
    """The backend for ``url`` (sqlite, memory, postgresql, mysql/mariadb, nats: see ``docs/``)."""
    backend = _backend_for(url, options, codec)
    backend.audit_key = options.audit_key
    return backend


def _backend_for(url: str, options: StoreOptions, codec: Codec) -> StorageBackend:
    if not isinstance(url, str):
        raise InvalidArgument(f"store URL must be a str, got {type(url).__name__}")
    scheme = urlsplit(url).scheme
    if scheme in ("sqlite", "memory"):
        from .backends.sqlite.backend import SqliteBackend

        return SqliteBackend(
            url,
            sqlite_path(url),
            codec=codec,
            durability=options.durability,
            busy_timeout_ms=options.busy_timeout_ms,
            migrate=options.migrate,
        )
    if scheme in ("postgresql", "postgres"):
        try:
            from .backends.postgres.backend import PostgresBackend
        except ImportError as exc:  # asyncpg is an optional extra
            raise InvalidArgument(
                f"PostgreSQL support needs asyncpg: pip install 'statekeel[postgres]' ({exc})"
            ) from exc
        return PostgresBackend(url, codec=codec, migrate=options.migrate)
    if scheme in ("mysql", "mariadb"):
        try:
            from .backends.mysql.backend import MySqlBackend
        except ImportError as exc:  # asyncmy is an optional extra
            raise InvalidArgument(
                f"MySQL/MariaDB support needs asyncmy: pip install 'statekeel[mysql]' ({exc})"
            ) from exc
        return MySqlBackend(url, codec=codec, migrate=options.migrate)
    if scheme == "nats":
        return _nats_backend(url, options, codec)
    raise InvalidArgument(
        f"unknown store URL scheme {scheme!r} in {url!r}; use sqlite:///file.db, memory://, postgresql://, "
        "mysql:// or nats://",
        url=url,
    )


# The kinds a NATS backend holds when paired with a SQL backend and the URL names no ``kinds=``: sessions
# (with their tool calls), the audit chain and traces. The SQL kinds' audit entries reach the chain on
# NATS through an outbox written in their own transaction (see statekeel.backends.relay).
NATS_PAIRED_KINDS = PAIRED_KINDS


def _nats_backend(url: str, options: StoreOptions, codec: Codec) -> StorageBackend:
    try:
        from .backends.nats.backend import new_nats_backend
    except ImportError as exc:  # nats-py is an optional extra
        raise InvalidArgument(f"NATS support needs nats-py: pip install 'statekeel[nats]' ({exc})") from exc
    parsed = parse_nats_url(url)
    rest = parsed.rest
    if rest is None:
        return new_nats_backend(url, codec=codec, migrate=options.migrate)
    if urlsplit(rest).scheme == "nats":
        raise InvalidArgument(f"rest= in {url!r} must name a SQL store, not another NATS one", url=url)
    from .backends.composite import pair_backends

    front_url = url[: len(url) - len(rest) - len("rest=") - 1]
    base, _, query = front_url.partition("?")
    kept = "&".join(item for item in query.split("&") if item and not item.startswith("kinds="))
    front_url = f"{base}?{kept}" if kept else base
    front = new_nats_backend(front_url, codec=codec, migrate=options.migrate)
    return pair_backends(url, front, _backend_for(resolve_url(rest), options, codec), parsed.kinds)


# The kinds each manager needs from the backend.
MANAGER_KINDS: dict[str, frozenset[str]] = {
    "sessions": frozenset({"sessions", "tool_calls"}),
    "tasks": frozenset({"tasks"}),
    "workflows": frozenset({"workflows", "tasks"}),
    "schedules": frozenset({"schedules", "tasks"}),
    "audit": frozenset({"audit"}),
    "approvals": frozenset({"approvals", "audit"}),
    "memory": frozenset({"memory"}),
    "files": frozenset({"files"}),
    "traces": frozenset({"traces"}),
    "vectors": frozenset({"vectors"}),
}

COUNTED_KINDS = ("sessions", "tasks", "workflows", "approvals", "audit", "memory", "files", "checkpoints")

M = TypeVar("M")


def unheld(url: str, name: str, missing: frozenset[str], held: frozenset[str]) -> Unsupported:
    """The ``Unsupported`` of opening ``store.<name>`` on a store whose backend lacks ``missing``: it names
    what is missing, what the backend holds, and the URL that pairs it with a SQL store for the rest."""
    shown = redact_url(url)
    if "rest=" in shown:  # paired already: what is missing is what its sessions on NATS cannot give
        return Unsupported(
            f"the store at {shown} keeps its sessions on NATS, so {name} is not available on it (it "
            f"needs {', '.join(sorted(missing))}, which visits sessions as SQL rows); pair with "
            "kinds=audit,traces before rest= to keep the sessions in the SQL store",
            kind=sorted(missing)[0],
            url=shown,
            holds=sorted(held),
            hint="",
        )
    pairing = f"{shown}{'&' if '?' in shown else '?'}rest=sqlite:///state.db"
    return Unsupported(
        f"the store at {shown} does not hold {', '.join(sorted(missing))}, so store.{name} is not "
        f"available on it (it holds {', '.join(sorted(held))}); pair it with a SQL store for the other "
        f"kinds: open_store({pairing!r}) (rest= last, any SQL URL)",
        kind=sorted(missing)[0],
        url=shown,
        holds=sorted(held),
        hint="",
    )


class _Manager(Generic[M]):
    """A manager of :class:`Store` (``store.tasks`` …): opening it on a store whose backend does not hold
    the kinds it needs raises ``Unsupported`` there and then, before any of its operations is called."""

    def __set_name__(self, owner: type[Any], name: str) -> None:
        self._name = name

    @overload
    def __get__(self, store: None, owner: type[Any] | None = None) -> _Manager[M]: ...

    @overload
    def __get__(self, store: Store, owner: type[Any] | None = None) -> M: ...

    def __get__(self, store: Store | None, owner: type[Any] | None = None) -> M | _Manager[M]:
        if store is None:
            return self
        held = store.backend.kinds
        missing = MANAGER_KINDS[self._name] - held
        if missing:
            raise unheld(store.url, self._name, missing, held)
        manager: M = store._managers[self._name]
        return manager

    def __set__(self, store: Store, manager: M) -> None:
        store._managers[self._name] = manager


class Store:
    """The facade over one backend. Get one with :func:`open_store`.

    A manager whose kinds the backend does not hold (``store.tasks`` on a plain ``nats://`` store) raises
    ``Unsupported`` when it is opened; :meth:`holds` says beforehand."""

    sessions = _Manager[SessionManager]()
    """:class:`SessionManager`: sessions, their messages, locks and tool calls."""
    tasks = _Manager[TaskManager]()
    """:class:`TaskManager`: tasks, their leases and steps."""
    workflows = _Manager[WorkflowEngine]()
    """:class:`WorkflowEngine`: workflows of tasks."""
    schedules = _Manager[ScheduleManager]()
    """:class:`ScheduleManager`: schedules that create a task per slot."""
    audit = _Manager[AuditLog]()
    """:class:`AuditLog`: the audit chain."""
    approvals = _Manager[ApprovalLog]()
    """:class:`ApprovalLog`: approvals (with their audit entries)."""
    memory = _Manager[MemoryStore]()
    """:class:`MemoryStore`: long-term memory, episodes and the graph."""
    files = _Manager[FileLedger]()
    """:class:`FileLedger`: the file ledger."""
    traces = _Manager[TraceLog]()
    """:class:`TraceLog`: trace spans."""
    vectors = _Manager[VectorIndex]()
    """:class:`VectorIndex`: vectors and search."""

    def __init__(self, url: str, options: StoreOptions) -> None:
        self.url = url
        self.options = options
        self.codec = Codec(
            max_record_bytes=options.max_record_bytes,
            cipher=make_cipher(
                options.encryption_key, encrypt_existing=options.encrypt_existing, keyring=options.keyring
            ),
        )
        try:
            self.backend: StorageBackend = make_backend(url, options, self.codec)
        except BaseException:
            if self.codec.cipher is not None and self.codec.cipher.ring is not None:
                self.codec.cipher.ring.close()  # opened first (a bad ring is refused before the backend)
            raise
        fallback_dir = options.fallback_dir if options.fallback_dir is not None else default_fallback_dir(url)
        # Made for every store (making one touches no state); opened only where the backend holds them.
        self._managers: dict[str, Any] = {}
        tasks = TaskManager(self.backend, self.codec)
        audit = AuditLog(self.backend, self.codec)
        self.sessions = SessionManager(
            self.backend, self.codec, fallback_dir=fallback_dir, cache_size=options.cache_size
        )
        self.tasks = tasks
        self.workflows = WorkflowEngine(self.backend, self.codec, tasks)
        self.schedules = ScheduleManager(self.backend, self.codec)
        self.audit = audit
        self.approvals = ApprovalLog(self.backend, self.codec, audit)
        self.memory = MemoryStore(self.backend, self.codec)
        self.files = FileLedger(self.backend)
        self.traces = TraceLog(self.backend, self.codec)
        self.vectors = VectorIndex(self.backend, self.codec)
        self._closed = False

    def holds(self, kind: str) -> bool:
        """Whether this store's backend holds ``kind``: a manager's name (``"sessions"``, ``"tasks"`` …:
        what ``store.<manager>`` needs) or a state kind of ``statekeel.backends.base.KIND_CONTRACTS``.
        False for the kinds a plain ``nats://`` store does not hold, whose managers raise ``Unsupported``
        when opened. Never raises for a known name; ``InvalidArgument`` for another.

        if store.holds("tasks"):
            await store.tasks.create(...)
        """
        needs = MANAGER_KINDS.get(kind)
        if needs is None:
            if kind not in KIND_CONTRACTS:
                raise InvalidArgument(
                    f"{kind!r} is neither a manager of the store nor a state kind; use one of "
                    f"{', '.join(sorted(set(MANAGER_KINDS) | set(KIND_CONTRACTS)))}",
                    kind=kind,
                )
            needs = frozenset({kind})
        return needs <= self.backend.kinds

    async def _open(self) -> Store:
        await self.backend.initialize()
        return self

    async def recover(
        self,
        repair: bool = True,
        *,
        now: dt.datetime | None = None,
        files_root: str | os.PathLike[str] | None = None,
        check_integrity: bool = True,
    ) -> RecoveryReport:
        """Restore the meaning of the state after a crash; idempotent (:mod:`statekeel.recovery`). With
        ``files_root`` the file ledger is compared with the files under it; ``check_integrity=False``
        leaves out the engine's integrity check (it reads the whole database).

        report = await store.recover()
        assert report.ok, report.summary()
        """
        return await recover(
            self, repair=repair, now=now, files_root=files_root, check_integrity=check_integrity
        )

    async def health(self, *, files_root: str | os.PathLike[str] | None = None) -> HealthReport:
        """Run every health check without changing the store: integrity, schema, fallback files waiting,
        incidents, the audit chain, tool calls left without a result, expired leases, steps in doubt and
        (with ``files_root``) drift of recorded files. Each finding says what to do. See
        :mod:`statekeel.health`.

        report = await store.health()
        if not report.ok:
            for finding in report.problems:
                print(finding.check, finding.detail, "->", finding.advice)
        """
        # Both run the integrity check: info() to count a damaged store's state, recover() to assess it.
        info = await self.info()
        recovery = await self.recover(repair=False, files_root=files_root)
        return health(info, recovery, drift_checked=files_root is not None)

    async def incidents(self, *, include_acknowledged: bool = False) -> list[Incident]:
        """Damage statekeel noticed in its own storage (oldest first): those nobody acknowledged yet, or all.

        for incident in await store.incidents():
            print(incident.kind, incident.detail["what_to_do"])
        """
        check_bool(include_acknowledged, "include_acknowledged")
        return await self.backend.list_incidents(include_acknowledged=include_acknowledged)

    async def acknowledge_incident(self, incident_id: int, by: str) -> Incident:
        """Record that ``by`` has dealt with an incident: ``recover()`` and ``info()`` stop reporting it.

        ``NotFound`` when there is no such unacknowledged incident."""
        check_int(incident_id, "incident_id", minimum=1)
        check_key(by, "by")
        done = await self.backend.acknowledge_incident(incident_id, by)
        if done is None:
            raise NotFound(
                f"there is no unacknowledged incident {incident_id}; list them with store.incidents()",
                incident_id=incident_id,
                hint="",
            )
        return done

    async def purge(
        self,
        now: dt.datetime | None = None,
        *,
        dry_run: bool = False,
        on_batch: Callable[[dict[str, int]], object] | None = None,
    ) -> PurgeReport:
        """Delete what the store's ``retention`` allows at ``now`` (default: now), in short batches, never a
        protected row; ``dry_run`` writes nothing and reports the same counts. ``on_batch(counts)`` gets
        the rows per kind after each batch (for a progress display). See :mod:`statekeel.retention`.

        report = await store.purge(dry_run=True)
        print(report.counts, report.longest_batch_seconds)
        """
        if not self.holds("retention"):
            # Refused whole, before the first batch: a purge is never done for some kinds only.
            raise unheld(self.url, "purge()", frozenset({"retention"}), self.backend.kinds)
        return await purge(self, self.options.retention, now, dry_run, on_batch)

    async def erase(
        self,
        subject: str,
        *,
        dry_run: bool = False,
        actor: str,
        reason: str,
        batch_size: int = 100,
        log_wait: float = 5.0,
    ) -> ErasureReport:
        """Delete everything about ``subject`` (sessions by key or ``metadata["subject"]`` with all they hold,
        memories of that scope, relations and episodes naming it) in short batches, with one ``erasure``
        audit entry; audit entries and approvals stay. ``dry_run`` writes nothing and counts. Run again, an
        interrupted erasure finishes; ``report.complete`` False (SQLite: a reader held the log's checkpoint
        past ``log_wait`` s) means text is still on disk and ``report.advice`` says what finishes it.

        report = await store.erase("user:alice", actor="dpo", reason="GDPR art. 17 request #113")
        print(report.counts)
        """
        return await erase(
            self,
            subject,
            dry_run=dry_run,
            actor=actor,
            reason=reason,
            batch_size=batch_size,
            log_wait=log_wait,
        )

    async def backup(self, dest: str | os.PathLike[str]) -> BackupReport:
        """Write a consistent copy of the whole store to the new SQLite file ``dest`` (0600; never
        overwritten: an existing file raises ``InvalidArgument``) while the store stays in use. SQLite
        stores are copied with SQLite's online backup API (one committed snapshot); PostgreSQL and memory
        stores with :func:`statekeel.copy_store`, every row verified (their writers should be stopped).
        See :mod:`statekeel.backup`.

        report = await store.backup("agent-state.backup.db")
        print(report.path, report.bytes)
        """
        return await backup(
            self.backend, dest, busy_timeout_ms=self.options.busy_timeout_ms, open_copy=open_store
        )

    async def rotate_encryption_key(
        self, *, batch_size: int = 500, on_batch: RotationProgress | None = None
    ) -> RotationReport:
        """Re-encrypt every encrypted field that is not under the current key (the first of
        ``encryption_key``) — and, in ``encrypt_existing`` mode, every plaintext one — in batches of
        ``batch_size`` rows, each committed on its own. Interrupted (killed, failed), it is run again and
        continues: rows already under the current key are left as they are. Then every fallback file
        (sessions saved while the backend was unavailable) is re-sealed under the current key, atomically
        and only if no other writer replaced it meanwhile; a file it cannot read stops it with that error
        (replay the files with ``recover()``, then run it again). Once it returned, the old keys can be
        dropped from ``encryption_key``: nothing the store reads still needs them (a quarantined
        fallback file, set aside for a person, keeps the key it was written under).
        ``on_batch(table, scanned, rewritten)`` is called after each committed batch with that table's
        counts so far (for a progress display). See :mod:`statekeel.codec.encryption`.

        store = await open_store(url, encryption_key=[new_key, old_key])
        report = await store.rotate_encryption_key()
        print(report.key_id, report.rewritten)
        """
        check_int(batch_size, "batch_size", minimum=1)
        if on_batch is not None and not callable(on_batch):
            raise InvalidArgument(f"on_batch must be callable, got {type(on_batch).__name__}")
        if self.codec.cipher is None:
            raise InvalidArgument("rotate_encryption_key needs a store opened with an encryption_key")
        cipher = self.codec.cipher
        return await rotate(
            self.backend, cipher.key_id, batch_size, on_batch, self.sessions.fallback, ring=cipher.ring
        )

    async def vacuum(self) -> int | None:
        """Rewrite a SQLite file without its free pages (``VACUUM``: it holds the write lock until done)
        and switch it to incremental auto-vacuum, so that later purges give space back by themselves.
        Returns the free pages left (0), or None for a store without a file of its own."""
        space = await self.backend.vacuum()
        return None if space is None else space.free_pages

    async def info(self, *, check_integrity: bool = True) -> StoreInfo:
        """Schema and health facts: schema version and migrations, counts per state kind, file sizes,
        fallback files waiting, and the integrity check (skipped with ``check_integrity=False``: on SQLite
        it reads the whole database). Never changes the database.

        info = await store.info()
        print(info.schema_version, info.counts.sessions["active"], info.ok)
        """
        check_bool(check_integrity, "check_integrity")
        backend = self.backend
        migrations = tuple(await backend.migrations())
        pending = tuple(await backend.pending_migrations())
        problems = tuple(await backend.integrity_check()) if check_integrity else None
        counts: StateCounts | None
        try:
            counts = await backend.count_state()
        except StorageCorrupt:
            if not problems:
                raise
            counts = None  # the problems found by the integrity check say why
        fallback = self.sessions.fallback if self.holds("sessions") else None
        waiting = 0 if fallback is None else await asyncio.to_thread(lambda: sum(1 for _ in fallback.files()))
        scheme = urlsplit(self.url).scheme
        return StoreInfo(
            url=redact_url(self.url),
            backend="postgresql" if scheme == "postgres" else scheme,
            schema_version=max((m.version for m in migrations), default=0),
            migrations=migrations,
            pending_migrations=pending,
            counts=counts,
            files=await backend.database_files(),
            fallback_dir=None if fallback is None else fallback.path,
            fallback_files=waiting,
            integrity=problems,
            incidents=tuple(await backend.list_incidents()),
            not_held=tuple(kind for kind in COUNTED_KINDS if not self.holds(kind)),
        )

    async def close(self) -> None:
        """Flush buffered state and close the backend. Idempotent."""
        if self._closed:
            return
        self._closed = True
        if self.holds("sessions"):
            await self.sessions.close()
        try:
            # Buffered tiers: what they hold is written before the backend closes.
            try:
                if self.holds("memory"):
                    await self.memory.close()
            finally:
                if self.holds("traces"):
                    await self.traces.close()
        finally:
            try:
                await self.backend.close()
            finally:
                if self.codec.cipher is not None and self.codec.cipher.ring is not None:
                    self.codec.cipher.ring.close()

    async def __aenter__(self) -> Store:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


class _Opener:
    """What ``open_store`` returns: await it, or use it as ``async with``."""

    def __init__(self, url: str, options: StoreOptions) -> None:
        self._url = url
        self._options = options
        self._store: Store | None = None

    def __await__(self) -> Generator[Any, None, Store]:
        return Store(self._url, self._options)._open().__await__()

    async def __aenter__(self) -> Store:
        self._store = await Store(self._url, self._options)._open()
        return self._store

    async def __aexit__(self, *exc: object) -> None:
        if self._store is not None:
            await self._store.close()


def open_store(
    url: str | None = None,
    *,
    fallback_dir: str | None = None,
    cache_size: int = 200,
    durability: str = "normal",
    busy_timeout_ms: int = 5000,
    max_record_bytes: int = DEFAULT_MAX_RECORD_BYTES,
    encryption_key: bytes | Sequence[bytes] | None = None,
    encrypt_existing: bool = False,
    migrate: bool = True,
    audit_key: bytes | None = None,
    retention: Retention | None = None,
    keyring: str | os.PathLike[str] | None = None,
) -> _Opener:
    """Open (creating and migrating if needed) the store at ``url``; with no ``url``, at
    ``$STATEKEEL_URL``, else ``sqlite:///statekeel.db`` (as the ``statekeel`` command does).

    ``await open_store(url)`` returns a :class:`Store`; ``async with open_store(url) as store:`` closes it
    at the end of the block. URLs: ``sqlite:///relative.db``, ``sqlite:////abs/path.db``, ``memory://``,
    ``postgresql://user@host:5432/db`` (``postgresql+asyncpg://`` is accepted too), ``nats://host:4222``
    (NATS JetStream: sessions, audit and traces; ``nats://host:4222?rest=sqlite:///state.db`` pairs it
    with a SQL store for the other kinds).

    ``migrate=False`` never changes the schema: a store with pending migrations raises ``MigrationError``
    and is left as it was (for tools that inspect a store shared with agents of another version).

    ``audit_key`` (bytes, at least 16; keep it outside the database) authenticates the audit log: every
    entry appended gets an HMAC of its hash, and ``audit.verify()`` / ``recover()`` then detect a rewrite
    of the whole chain too. Every process writing the store must use the same key. See
    :mod:`statekeel.audit` for what each mode proves.
    ``retention`` says what :meth:`Store.purge` may delete and when (default ``Retention()``).

    ``encryption_key`` (32 bytes, e.g. ``os.urandom(32)``; keep it outside the database; needs
    ``pip install 'statekeel[encryption]'``) encrypts message payloads, memory content and data, step results
    and approval arguments with AES-256-GCM. A list ``[current, old, ...]`` reads values sealed under any of
    them and writes under the first; :meth:`Store.rotate_encryption_key` moves everything to the first. With
    a key, plaintext found on read is refused unless ``encrypt_existing=True`` (to encrypt a store written
    without a key). See :mod:`statekeel.codec.encryption`.

    ``keyring`` (a path, with ``encryption_key``; made once by :func:`statekeel.create_keyring`) seals each
    session's messages and each memory scope's memories under a data key of their own, kept in that file
    wrapped by the store key: :meth:`Store.erase` then destroys the subject's data keys, so copies of the
    database taken before (backups) can no longer be read for it. Back the ring up apart from the
    database, and open the same ring from every process of the store. A missing, too open or damaged
    ring, or one made with another store key, raises ``KeyRingError`` before anything is written. See
    :mod:`statekeel.codec.keyring`.
    """
    options = StoreOptions(
        fallback_dir=fallback_dir,
        cache_size=cache_size,
        durability=durability,
        busy_timeout_ms=busy_timeout_ms,
        max_record_bytes=max_record_bytes,
        encryption_key=None if encryption_key is None else check_keys(encryption_key),
        encrypt_existing=encrypt_existing,
        migrate=migrate,
        audit_key=audit_key,
        retention=Retention() if retention is None else retention,
        keyring=keyring,
    )
    # Here, not at the await: a bad call fails where it is made.
    return _Opener(resolve_url(url), options)
