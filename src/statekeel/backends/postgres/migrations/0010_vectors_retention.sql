-- Vectors (the derived tier) and the indexes retention deletes by. Identifiers use the "C" collation so
-- that ordering (and cursors) match SQLite's byte order.

-- One row per embedding model: its dimension (fixed by the first vector) and a change counter that
-- in-process search caches compare with (generation: any change; removals: a vector deleted).
CREATE TABLE vector_models (
    model      TEXT COLLATE "C" PRIMARY KEY,
    dim        INTEGER NOT NULL CHECK (dim >= 1),
    generation BIGINT NOT NULL DEFAULT 0,
    removals   BIGINT NOT NULL DEFAULT 0,
    created_at TIMESTAMPTZ NOT NULL
);

-- embedding: little-endian float32, dim values. generation: the model's generation that wrote it.
CREATE TABLE vectors (
    vec_id         TEXT COLLATE "C" PRIMARY KEY,
    model          TEXT COLLATE "C" NOT NULL REFERENCES vector_models (model),
    source_id      TEXT COLLATE "C" NOT NULL,
    source_version BIGINT,
    embedding      BYTEA NOT NULL,
    metadata       JSONB NOT NULL DEFAULT '{}',
    generation     BIGINT NOT NULL,
    updated_at     TIMESTAMPTZ NOT NULL
);
CREATE INDEX vectors_by_source ON vectors (source_id, model, vec_id);
CREATE INDEX vectors_by_model ON vectors (model, generation);

-- The sources the index follows (memories, and sources announced with source_changed): their current
-- version and the newest version among their vectors. A source lags while no vector holds its version.
CREATE TABLE vector_sources (
    source_id       TEXT COLLATE "C" PRIMARY KEY,
    kind            TEXT NOT NULL CHECK (kind IN ('memory', 'external')),
    version         BIGINT NOT NULL CHECK (version >= 0),
    indexed_version BIGINT,
    changed_at      TIMESTAMPTZ NOT NULL,
    gone_at         TIMESTAMPTZ
);
CREATE INDEX vector_sources_lagging ON vector_sources (changed_at, source_id)
    WHERE gone_at IS NULL AND (indexed_version IS NULL OR indexed_version < version);
CREATE INDEX vector_sources_gone ON vector_sources (gone_at, source_id) WHERE gone_at IS NOT NULL;

-- How far the index has read the memories' changes (updated_at, id).
CREATE TABLE vector_cursors (
    name TEXT COLLATE "C" PRIMARY KEY,
    at   TIMESTAMPTZ NOT NULL,
    id   TEXT COLLATE "C" NOT NULL
);

-- Retention reads what it may delete from these, oldest first.
CREATE INDEX tasks_finished ON tasks (completed_at, id) WHERE status IN ('success', 'failed', 'cancelled');
CREATE INDEX workflows_finished ON workflows (completed_at, id)
    WHERE status IN ('success', 'failed', 'cancelled');
CREATE INDEX memories_forgotten ON memories (deleted_at, id) WHERE deleted_at IS NOT NULL;
CREATE INDEX memories_expiring ON memories (expires_at, id) WHERE expires_at IS NOT NULL;
