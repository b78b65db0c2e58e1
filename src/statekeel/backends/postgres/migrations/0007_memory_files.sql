-- Memories (typed, scoped, versioned, with their history), episodes, the temporal graph, contradictions
-- and the access log; and the file ledger. Identifiers and paths use the "C" collation so that ordering
-- (and cursors) match SQLite's byte order.

CREATE TABLE memories (
    id            TEXT COLLATE "C" PRIMARY KEY,
    type          TEXT NOT NULL
                  CHECK (type IN ('user', 'environment', 'semantic', 'episodic', 'procedural')),
    scope         TEXT COLLATE "C" NOT NULL,
    key           TEXT COLLATE "C",
    content       JSONB NOT NULL,
    data          JSONB,
    confidence    DOUBLE PRECISION NOT NULL CHECK (confidence >= 0.0 AND confidence <= 1.0),
    source        TEXT,
    created_at    TIMESTAMPTZ NOT NULL,
    updated_at    TIMESTAMPTZ NOT NULL,
    expires_at    TIMESTAMPTZ,
    -- No foreign key: purging the newer memory must not bring the older one back to life.
    superseded_by TEXT COLLATE "C",
    deleted_at    TIMESTAMPTZ,
    version       BIGINT NOT NULL DEFAULT 1 CHECK (version >= 1)
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
    memory_id TEXT COLLATE "C" NOT NULL REFERENCES memories (id) ON DELETE CASCADE,
    version   BIGINT NOT NULL CHECK (version >= 1),
    event     TEXT NOT NULL CHECK (event IN ('ADD', 'UPDATE', 'DELETE', 'SUPERSEDE')),
    state     JSONB NOT NULL,
    actor     TEXT,
    reason    TEXT,
    at        TIMESTAMPTZ NOT NULL,
    PRIMARY KEY (memory_id, version)
);

CREATE FUNCTION statekeel_refuse_update() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'statekeel: % is append-only, UPDATE refused', TG_TABLE_NAME
        USING ERRCODE = 'restrict_violation';
END
$$;

CREATE TRIGGER memory_events_no_update BEFORE UPDATE ON memory_events
    FOR EACH ROW EXECUTE FUNCTION statekeel_refuse_update();

CREATE TABLE memory_episodes (
    id          TEXT COLLATE "C" PRIMARY KEY,
    session_key TEXT COLLATE "C" NOT NULL,
    summary     TEXT NOT NULL,
    first_seq   BIGINT CHECK (first_seq >= 0),
    upto_seq    BIGINT CHECK (upto_seq >= 0),
    entities    JSONB NOT NULL DEFAULT '[]',
    importance  DOUBLE PRECISION NOT NULL CHECK (importance >= 0.0 AND importance <= 1.0),
    created_at  TIMESTAMPTZ NOT NULL,
    CHECK (first_seq IS NULL OR upto_seq IS NULL OR first_seq <= upto_seq)
);
CREATE INDEX memory_episodes_by_session ON memory_episodes (session_key, created_at, id);
CREATE INDEX memory_episodes_by_created ON memory_episodes (created_at, id);

-- Edges are never deleted: unrelate sets valid_to. source_memory_id is the memory that produced an edge.
CREATE TABLE memory_relations (
    id               TEXT COLLATE "C" PRIMARY KEY,
    subject          TEXT COLLATE "C" NOT NULL,
    relation         TEXT COLLATE "C" NOT NULL,
    object           TEXT COLLATE "C" NOT NULL,
    weight           DOUBLE PRECISION NOT NULL,
    valid_from       TIMESTAMPTZ NOT NULL,
    valid_to         TIMESTAMPTZ,
    source_memory_id TEXT COLLATE "C" REFERENCES memories (id) ON DELETE SET NULL,
    created_at       TIMESTAMPTZ NOT NULL,
    CHECK (valid_to IS NULL OR valid_to >= valid_from)
);
CREATE INDEX memory_relations_by_subject ON memory_relations (subject, relation, valid_from);
CREATE INDEX memory_relations_by_object ON memory_relations (object, relation, valid_from);
CREATE INDEX memory_relations_by_source ON memory_relations (source_memory_id)
    WHERE source_memory_id IS NOT NULL;

CREATE TABLE memory_contradictions (
    id          TEXT COLLATE "C" PRIMARY KEY,
    memory_a    TEXT COLLATE "C" NOT NULL REFERENCES memories (id) ON DELETE CASCADE,
    memory_b    TEXT COLLATE "C" NOT NULL REFERENCES memories (id) ON DELETE CASCADE,
    description TEXT NOT NULL,
    resolution  TEXT,
    created_at  TIMESTAMPTZ NOT NULL,
    resolved_at TIMESTAMPTZ,
    CHECK ((resolution IS NULL) = (resolved_at IS NULL))
);
CREATE INDEX memory_contradictions_open ON memory_contradictions (created_at, id) WHERE resolved_at IS NULL;
CREATE INDEX memory_contradictions_by_a ON memory_contradictions (memory_a);
CREATE INDEX memory_contradictions_by_b ON memory_contradictions (memory_b);

-- An open contradiction is never purged, and neither (through the cascade) are its memories; a resolved
-- one is never rewritten.
CREATE FUNCTION statekeel_contradiction_guard() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'DELETE' AND OLD.resolved_at IS NULL THEN
        RAISE EXCEPTION 'statekeel: an unresolved contradiction is never deleted; resolve it first'
            USING ERRCODE = 'restrict_violation';
    END IF;
    IF TG_OP = 'UPDATE' AND OLD.resolved_at IS NOT NULL THEN
        RAISE EXCEPTION 'statekeel: a resolved contradiction cannot be changed'
            USING ERRCODE = 'restrict_violation';
    END IF;
    IF TG_OP = 'DELETE' THEN
        RETURN OLD;
    END IF;
    RETURN NEW;
END
$$;
CREATE TRIGGER memory_contradictions_guard BEFORE UPDATE OR DELETE ON memory_contradictions
    FOR EACH ROW EXECUTE FUNCTION statekeel_contradiction_guard();
CREATE TRIGGER memory_contradictions_no_truncate BEFORE TRUNCATE ON memory_contradictions
    FOR EACH STATEMENT EXECUTE FUNCTION statekeel_refuse_change();

-- The buffered access log: no foreign key, so a batch never fails on a memory purged since.
CREATE TABLE memory_accesses (
    id            TEXT COLLATE "C" PRIMARY KEY,
    memory_id     TEXT COLLATE "C" NOT NULL,
    at            TIMESTAMPTZ NOT NULL,
    context_query TEXT
);
CREATE INDEX memory_accesses_by_memory ON memory_accesses (memory_id, at, id);

-- The file ledger: every recorded change of a path (relative, normalised, POSIX), seq dense per path.
CREATE TABLE file_changes (
    path        TEXT COLLATE "C" NOT NULL,
    seq         BIGINT NOT NULL CHECK (seq >= 1),
    checksum    TEXT,
    size        BIGINT CHECK (size >= 0),
    action      TEXT NOT NULL CHECK (action IN ('created', 'modified', 'deleted')),
    task_id     TEXT COLLATE "C",
    session_key TEXT COLLATE "C",
    recorded_at TIMESTAMPTZ NOT NULL,
    PRIMARY KEY (path, seq),
    CHECK (action = 'deleted' OR (checksum IS NOT NULL AND size IS NOT NULL))
);
-- By task or session: the paths it touched (check) and its records (list).
CREATE INDEX file_changes_by_task ON file_changes (task_id, path, seq) WHERE task_id IS NOT NULL;
CREATE INDEX file_changes_by_session ON file_changes (session_key, path, seq) WHERE session_key IS NOT NULL;
CREATE INDEX file_changes_by_time ON file_changes (recorded_at, path, seq);

CREATE TRIGGER file_changes_no_update BEFORE UPDATE ON file_changes
    FOR EACH ROW EXECUTE FUNCTION statekeel_refuse_update();
