-- Memories (typed, scoped, versioned, with their history), episodes, the temporal graph, contradictions
-- and the access log; and the file ledger. Timestamps are integer microseconds since the Unix epoch, UTC;
-- JSON columns are TEXT.

CREATE TABLE memories (
    id            TEXT PRIMARY KEY NOT NULL,
    type          TEXT NOT NULL
                  CHECK (type IN ('user', 'environment', 'semantic', 'episodic', 'procedural')),
    scope         TEXT NOT NULL,
    key           TEXT,
    content       TEXT NOT NULL,
    data          TEXT,
    confidence    REAL NOT NULL CHECK (confidence >= 0.0 AND confidence <= 1.0),
    source        TEXT,
    created_at    INTEGER NOT NULL,
    updated_at    INTEGER NOT NULL,
    expires_at    INTEGER,
    -- No foreign key: purging the newer memory must not bring the older one back to life.
    superseded_by TEXT,
    deleted_at    INTEGER,
    version       INTEGER NOT NULL DEFAULT 1 CHECK (version >= 1)
);
-- At most one live memory per (type, scope, key): the target of put's upsert.
CREATE UNIQUE INDEX memories_live_key ON memories (type, scope, key)
    WHERE key IS NOT NULL AND deleted_at IS NULL AND superseded_by IS NULL;
-- Newest first, by filter; also "changed since" (updated_at moves with every change and version).
CREATE INDEX memories_by_updated ON memories (updated_at, id);
CREATE INDEX memories_by_scope ON memories (scope, updated_at, id);
CREATE INDEX memories_by_type_scope ON memories (type, scope, updated_at, id);
CREATE INDEX memories_by_key ON memories (key, updated_at, id);

-- One event per change; version is the memory's version after it, and state its fields after it.
CREATE TABLE memory_events (
    memory_id TEXT NOT NULL REFERENCES memories (id) ON DELETE CASCADE,
    version   INTEGER NOT NULL CHECK (version >= 1),
    event     TEXT NOT NULL CHECK (event IN ('ADD', 'UPDATE', 'DELETE', 'SUPERSEDE')),
    state     TEXT NOT NULL,
    actor     TEXT,
    reason    TEXT,
    at        INTEGER NOT NULL,
    PRIMARY KEY (memory_id, version)
);

CREATE TRIGGER memory_events_no_update BEFORE UPDATE ON memory_events
BEGIN
    SELECT RAISE(ABORT, 'statekeel: memory history is append-only, UPDATE refused');
END;

CREATE TABLE memory_episodes (
    id          TEXT PRIMARY KEY NOT NULL,
    session_key TEXT NOT NULL,
    summary     TEXT NOT NULL,
    first_seq   INTEGER CHECK (first_seq >= 0),
    upto_seq    INTEGER CHECK (upto_seq >= 0),
    entities    TEXT NOT NULL DEFAULT '[]',
    importance  REAL NOT NULL CHECK (importance >= 0.0 AND importance <= 1.0),
    created_at  INTEGER NOT NULL,
    CHECK (first_seq IS NULL OR upto_seq IS NULL OR first_seq <= upto_seq)
);
CREATE INDEX memory_episodes_by_session ON memory_episodes (session_key, created_at, id);
CREATE INDEX memory_episodes_by_created ON memory_episodes (created_at, id);

-- Edges are never deleted: unrelate sets valid_to. source_memory_id is the memory that produced an edge.
CREATE TABLE memory_relations (
    id               TEXT PRIMARY KEY NOT NULL,
    subject          TEXT NOT NULL,
    relation         TEXT NOT NULL,
    object           TEXT NOT NULL,
    weight           REAL NOT NULL,
    valid_from       INTEGER NOT NULL,
    valid_to         INTEGER,
    source_memory_id TEXT REFERENCES memories (id) ON DELETE SET NULL,
    created_at       INTEGER NOT NULL,
    CHECK (valid_to IS NULL OR valid_to >= valid_from)
);
CREATE INDEX memory_relations_by_subject ON memory_relations (subject, relation, valid_from);
CREATE INDEX memory_relations_by_object ON memory_relations (object, relation, valid_from);
CREATE INDEX memory_relations_by_source ON memory_relations (source_memory_id)
    WHERE source_memory_id IS NOT NULL;

CREATE TABLE memory_contradictions (
    id          TEXT PRIMARY KEY NOT NULL,
    memory_a    TEXT NOT NULL REFERENCES memories (id) ON DELETE CASCADE,
    memory_b    TEXT NOT NULL REFERENCES memories (id) ON DELETE CASCADE,
    description TEXT NOT NULL,
    resolution  TEXT,
    created_at  INTEGER NOT NULL,
    resolved_at INTEGER,
    CHECK ((resolution IS NULL) = (resolved_at IS NULL))
);
CREATE INDEX memory_contradictions_open ON memory_contradictions (created_at, id) WHERE resolved_at IS NULL;
CREATE INDEX memory_contradictions_by_a ON memory_contradictions (memory_a);
CREATE INDEX memory_contradictions_by_b ON memory_contradictions (memory_b);

-- An open contradiction is never purged, and neither (through the cascade) are its memories.
CREATE TRIGGER memory_contradictions_keep_open BEFORE DELETE ON memory_contradictions
WHEN OLD.resolved_at IS NULL
BEGIN
    SELECT RAISE(ABORT, 'statekeel: an unresolved contradiction is never deleted; resolve it first');
END;

CREATE TRIGGER memory_contradictions_resolved_once BEFORE UPDATE ON memory_contradictions
WHEN OLD.resolved_at IS NOT NULL
BEGIN
    SELECT RAISE(ABORT, 'statekeel: a resolved contradiction cannot be changed');
END;

-- The buffered access log: no foreign key, so a batch never fails on a memory purged since.
CREATE TABLE memory_accesses (
    id            TEXT PRIMARY KEY NOT NULL,
    memory_id     TEXT NOT NULL,
    at            INTEGER NOT NULL,
    context_query TEXT
);
CREATE INDEX memory_accesses_by_memory ON memory_accesses (memory_id, at, id);

-- The file ledger: every recorded change of a path (relative, normalised, POSIX), seq dense per path.
CREATE TABLE file_changes (
    path        TEXT NOT NULL,
    seq         INTEGER NOT NULL CHECK (seq >= 1),
    checksum    TEXT,
    size        INTEGER CHECK (size >= 0),
    action      TEXT NOT NULL CHECK (action IN ('created', 'modified', 'deleted')),
    task_id     TEXT,
    session_key TEXT,
    recorded_at INTEGER NOT NULL,
    PRIMARY KEY (path, seq),
    CHECK (action = 'deleted' OR (checksum IS NOT NULL AND size IS NOT NULL))
);
-- By task or session: the paths it touched (check) and its records (list).
CREATE INDEX file_changes_by_task ON file_changes (task_id, path, seq) WHERE task_id IS NOT NULL;
CREATE INDEX file_changes_by_session ON file_changes (session_key, path, seq) WHERE session_key IS NOT NULL;
CREATE INDEX file_changes_by_time ON file_changes (recorded_at, path, seq);

CREATE TRIGGER file_changes_no_update BEFORE UPDATE ON file_changes
BEGIN
    SELECT RAISE(ABORT, 'statekeel: the file ledger is append-only, UPDATE refused');
END;
