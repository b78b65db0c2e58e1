-- Vectors (the derived tier) and the indexes retention deletes by. Timestamps are integer microseconds
-- since the Unix epoch, UTC; JSON columns are TEXT.

-- One row per embedding model: its dimension (fixed by the first vector) and a change counter that
-- in-process search caches compare with (generation: any change; removals: a vector deleted).
CREATE TABLE vector_models (
    model      TEXT PRIMARY KEY NOT NULL,
    dim        INTEGER NOT NULL CHECK (dim >= 1),
    generation INTEGER NOT NULL DEFAULT 0,
    removals   INTEGER NOT NULL DEFAULT 0,
    created_at INTEGER NOT NULL
);

-- embedding: little-endian float32, dim values. generation: the model's generation that wrote it.
CREATE TABLE vectors (
    vec_id         TEXT PRIMARY KEY NOT NULL,
    model          TEXT NOT NULL REFERENCES vector_models (model),
    source_id      TEXT NOT NULL,
    source_version INTEGER,
    embedding      BLOB NOT NULL,
    metadata       TEXT NOT NULL DEFAULT '{}',
    generation     INTEGER NOT NULL,
    updated_at     INTEGER NOT NULL
);
CREATE INDEX vectors_by_source ON vectors (source_id, model, vec_id);
CREATE INDEX vectors_by_model ON vectors (model, generation);

-- The sources the index follows (memories, and sources announced with source_changed): their current
-- version and the newest version among their vectors. A source lags while no vector holds its version.
CREATE TABLE vector_sources (
    source_id       TEXT PRIMARY KEY NOT NULL,
    kind            TEXT NOT NULL CHECK (kind IN ('memory', 'external')),
    version         INTEGER NOT NULL CHECK (version >= 0),
    indexed_version INTEGER,
    changed_at      INTEGER NOT NULL,
    gone_at         INTEGER
);
CREATE INDEX vector_sources_lagging ON vector_sources (changed_at, source_id)
    WHERE gone_at IS NULL AND (indexed_version IS NULL OR indexed_version < version);
CREATE INDEX vector_sources_gone ON vector_sources (gone_at, source_id) WHERE gone_at IS NOT NULL;

-- How far the index has read the memories' changes (updated_at, id).
CREATE TABLE vector_cursors (
    name TEXT PRIMARY KEY NOT NULL,
    at   INTEGER NOT NULL,
    id   TEXT NOT NULL
);

-- Retention reads what it may delete from these, oldest first.
CREATE INDEX tasks_finished ON tasks (completed_at, id) WHERE status IN ('success', 'failed', 'cancelled');
CREATE INDEX workflows_finished ON workflows (completed_at, id)
    WHERE status IN ('success', 'failed', 'cancelled');
CREATE INDEX memories_forgotten ON memories (deleted_at, id) WHERE deleted_at IS NOT NULL;
CREATE INDEX memories_expiring ON memories (expires_at, id) WHERE expires_at IS NOT NULL;
