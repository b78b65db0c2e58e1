-- Vectors (the derived tier) and the indexes retention deletes by.

-- One row per embedding model: its dimension (fixed by the first vector) and a change counter that
-- in-process search caches compare with (generation: any change; removals: a vector deleted).
CREATE TABLE IF NOT EXISTS vector_models (
    model      VARCHAR(512) NOT NULL PRIMARY KEY,
    dim        INTEGER NOT NULL CHECK (dim >= 1),
    generation BIGINT NOT NULL DEFAULT 0,
    removals   BIGINT NOT NULL DEFAULT 0,
    created_at DATETIME(6) NOT NULL
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;

-- embedding: little-endian float32, dim values. generation: the model's generation that wrote it.
CREATE TABLE IF NOT EXISTS vectors (
    vec_id         VARCHAR(512) NOT NULL PRIMARY KEY,
    model          VARCHAR(512) NOT NULL,
    source_id      VARCHAR(512) NOT NULL,
    source_version BIGINT,
    embedding      LONGBLOB NOT NULL,
    metadata       LONGTEXT NOT NULL DEFAULT '{}',
    generation     BIGINT NOT NULL,
    updated_at     DATETIME(6) NOT NULL,
    CONSTRAINT vectors_model FOREIGN KEY (model) REFERENCES vector_models (model)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;
CREATE INDEX IF NOT EXISTS vectors_by_source ON vectors (source_id, model(255));
CREATE INDEX IF NOT EXISTS vectors_by_model ON vectors (model, generation);

-- The sources the index follows (memories, and sources announced with source_changed): their current
-- version and the newest version among their vectors. A source lags while no vector holds its version.
CREATE TABLE IF NOT EXISTS vector_sources (
    source_id       VARCHAR(512) NOT NULL PRIMARY KEY,
    kind            VARCHAR(16) NOT NULL CHECK (kind IN ('memory', 'external')),
    version         BIGINT NOT NULL CHECK (version >= 0),
    indexed_version BIGINT,
    changed_at      DATETIME(6) NOT NULL,
    gone_at         DATETIME(6)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;
CREATE INDEX IF NOT EXISTS vector_sources_lagging ON vector_sources (changed_at, source_id);
CREATE INDEX IF NOT EXISTS vector_sources_gone ON vector_sources (gone_at, source_id);

-- How far the index has read the memories' changes (updated_at, id).
CREATE TABLE IF NOT EXISTS vector_cursors (
    name VARCHAR(255) NOT NULL PRIMARY KEY,
    at   DATETIME(6) NOT NULL,
    id   VARCHAR(512) NOT NULL
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;

-- Retention reads what it may delete from these, oldest first.
CREATE INDEX IF NOT EXISTS tasks_finished ON tasks (completed_at, id);
CREATE INDEX IF NOT EXISTS workflows_finished ON workflows (completed_at, id);
CREATE INDEX IF NOT EXISTS memories_forgotten ON memories (deleted_at, id);
CREATE INDEX IF NOT EXISTS memories_expiring ON memories (expires_at, id);
