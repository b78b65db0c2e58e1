-- Memories (typed, scoped, versioned, with their history), episodes, the temporal graph, contradictions
-- and the access log; and the file ledger.

CREATE TABLE IF NOT EXISTS memories (
    id            VARCHAR(512) NOT NULL PRIMARY KEY,
    type          VARCHAR(16) NOT NULL
                  CHECK (type IN ('user', 'environment', 'semantic', 'episodic', 'procedural')),
    scope         VARCHAR(512) NOT NULL,
    `key`         VARCHAR(512),
    content       LONGTEXT NOT NULL,
    data          LONGTEXT,
    confidence    DOUBLE NOT NULL CHECK (confidence >= 0.0 AND confidence <= 1.0),
    source        LONGTEXT,
    created_at    DATETIME(6) NOT NULL,
    updated_at    DATETIME(6) NOT NULL,
    expires_at    DATETIME(6),
    -- No foreign key: purging the newer memory must not bring the older one back to life.
    superseded_by VARCHAR(512),
    deleted_at    DATETIME(6),
    version       BIGINT NOT NULL DEFAULT 1 CHECK (version >= 1),
    -- The key of a live memory (NULL once forgotten or superseded): at most one live memory per
    -- (type, scope, key), the target of put's upsert. MariaDB has no partial index; NULLs never collide.
    live_key      VARCHAR(512) AS (IF(deleted_at IS NULL AND superseded_by IS NULL, `key`, NULL)) PERSISTENT,
    UNIQUE KEY memories_live_key (type, scope, live_key) USING HASH
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;
-- Newest first, by filter; also "changed since" (updated_at moves with every change and version).
CREATE INDEX IF NOT EXISTS memories_by_updated ON memories (updated_at, id);
CREATE INDEX IF NOT EXISTS memories_by_scope ON memories (scope, updated_at);
CREATE INDEX IF NOT EXISTS memories_by_type_scope ON memories (type, scope, updated_at);
CREATE INDEX IF NOT EXISTS memories_by_key ON memories (`key`, updated_at);

-- One event per change; version is the memory's version after it, and state its fields after it.
CREATE TABLE IF NOT EXISTS memory_events (
    memory_id VARCHAR(512) NOT NULL,
    version   BIGINT NOT NULL CHECK (version >= 1),
    event     VARCHAR(16) NOT NULL CHECK (event IN ('ADD', 'UPDATE', 'DELETE', 'SUPERSEDE')),
    state     LONGTEXT NOT NULL,
    actor     VARCHAR(512),
    reason    LONGTEXT,
    at        DATETIME(6) NOT NULL,
    PRIMARY KEY (memory_id, version),
    CONSTRAINT memory_events_memory FOREIGN KEY (memory_id) REFERENCES memories (id) ON DELETE CASCADE
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;

CREATE OR REPLACE TRIGGER memory_events_no_update BEFORE UPDATE ON memory_events FOR EACH ROW
BEGIN
    SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = 'statekeel: memory_events is append-only, UPDATE refused';
END;

CREATE TABLE IF NOT EXISTS memory_episodes (
    id          VARCHAR(512) NOT NULL PRIMARY KEY,
    session_key VARCHAR(512) NOT NULL,
    summary     LONGTEXT NOT NULL,
    first_seq   BIGINT CHECK (first_seq >= 0),
    upto_seq    BIGINT CHECK (upto_seq >= 0),
    entities    LONGTEXT NOT NULL DEFAULT '[]',
    importance  DOUBLE NOT NULL CHECK (importance >= 0.0 AND importance <= 1.0),
    created_at  DATETIME(6) NOT NULL,
    CONSTRAINT memory_episodes_range CHECK (first_seq IS NULL OR upto_seq IS NULL OR first_seq <= upto_seq)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;
CREATE INDEX IF NOT EXISTS memory_episodes_by_session ON memory_episodes (session_key, created_at);
CREATE INDEX IF NOT EXISTS memory_episodes_by_created ON memory_episodes (created_at, id);

-- Edges are never deleted: unrelate sets valid_to. source_memory_id is the memory that produced an edge.
CREATE TABLE IF NOT EXISTS memory_relations (
    id               VARCHAR(512) NOT NULL PRIMARY KEY,
    subject          VARCHAR(512) NOT NULL,
    relation         VARCHAR(512) NOT NULL,
    object           VARCHAR(512) NOT NULL,
    weight           DOUBLE NOT NULL,
    valid_from       DATETIME(6) NOT NULL,
    valid_to         DATETIME(6),
    source_memory_id VARCHAR(512),
    created_at       DATETIME(6) NOT NULL,
    CONSTRAINT memory_relations_valid CHECK (valid_to IS NULL OR valid_to >= valid_from),
    CONSTRAINT memory_relations_source FOREIGN KEY (source_memory_id) REFERENCES memories (id)
        ON DELETE SET NULL
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;
CREATE INDEX IF NOT EXISTS memory_relations_by_subject ON memory_relations (subject(255), relation(255), valid_from);
CREATE INDEX IF NOT EXISTS memory_relations_by_object ON memory_relations (object(255), relation(255), valid_from);

CREATE TABLE IF NOT EXISTS memory_contradictions (
    id          VARCHAR(512) NOT NULL PRIMARY KEY,
    memory_a    VARCHAR(512) NOT NULL,
    memory_b    VARCHAR(512) NOT NULL,
    description LONGTEXT NOT NULL,
    resolution  LONGTEXT,
    created_at  DATETIME(6) NOT NULL,
    resolved_at DATETIME(6),
    CONSTRAINT memory_contradictions_resolved CHECK ((resolution IS NULL) = (resolved_at IS NULL)),
    CONSTRAINT memory_contradictions_a FOREIGN KEY (memory_a) REFERENCES memories (id) ON DELETE CASCADE,
    CONSTRAINT memory_contradictions_b FOREIGN KEY (memory_b) REFERENCES memories (id) ON DELETE CASCADE
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;
CREATE INDEX IF NOT EXISTS memory_contradictions_open ON memory_contradictions (resolved_at, created_at, id);

-- An open contradiction is never deleted; a resolved one is never rewritten. Rows a foreign key's cascade
-- removes fire no trigger on MariaDB, so deleting a memory is refused here while one of its contradictions
-- is open (a resolved one follows it by cascade).
CREATE OR REPLACE TRIGGER memories_keep_contradicted BEFORE DELETE ON memories FOR EACH ROW
BEGIN
    IF EXISTS (SELECT 1 FROM memory_contradictions
               WHERE resolved_at IS NULL AND (memory_a = OLD.id OR memory_b = OLD.id)) THEN
        SIGNAL SQLSTATE '45000'
            SET MESSAGE_TEXT = 'statekeel: an unresolved contradiction is never deleted; resolve it first';
    END IF;
END;

CREATE OR REPLACE TRIGGER memory_contradictions_no_delete BEFORE DELETE ON memory_contradictions FOR EACH ROW
BEGIN
    IF OLD.resolved_at IS NULL THEN
        SIGNAL SQLSTATE '45000'
            SET MESSAGE_TEXT = 'statekeel: an unresolved contradiction is never deleted; resolve it first';
    END IF;
END;

CREATE OR REPLACE TRIGGER memory_contradictions_no_update BEFORE UPDATE ON memory_contradictions FOR EACH ROW
BEGIN
    IF OLD.resolved_at IS NOT NULL THEN
        SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = 'statekeel: a resolved contradiction cannot be changed';
    END IF;
END;

-- The buffered access log: no foreign key, so a batch never fails on a memory purged since.
CREATE TABLE IF NOT EXISTS memory_accesses (
    id            VARCHAR(512) NOT NULL PRIMARY KEY,
    memory_id     VARCHAR(512) NOT NULL,
    at            DATETIME(6) NOT NULL,
    context_query LONGTEXT
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;
CREATE INDEX IF NOT EXISTS memory_accesses_by_memory ON memory_accesses (memory_id, at);

-- The file ledger: every recorded change of a path (relative, normalised, POSIX), seq dense per path.
CREATE TABLE IF NOT EXISTS file_changes (
    path        VARCHAR(700) NOT NULL,
    seq         BIGINT NOT NULL CHECK (seq >= 1),
    checksum    VARCHAR(128),
    size        BIGINT CHECK (size >= 0),
    action      VARCHAR(16) NOT NULL CHECK (action IN ('created', 'modified', 'deleted')),
    task_id     VARCHAR(512),
    session_key VARCHAR(512),
    recorded_at DATETIME(6) NOT NULL,
    PRIMARY KEY (path, seq),
    CONSTRAINT file_changes_content CHECK (action = 'deleted' OR (checksum IS NOT NULL AND size IS NOT NULL))
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;
-- By task or session: the paths it touched (check) and its records (list).
CREATE INDEX IF NOT EXISTS file_changes_by_task ON file_changes (task_id(255), path(255), seq);
CREATE INDEX IF NOT EXISTS file_changes_by_session ON file_changes (session_key(255), path(255), seq);
CREATE INDEX IF NOT EXISTS file_changes_by_time ON file_changes (recorded_at, path(255), seq);

CREATE OR REPLACE TRIGGER file_changes_no_update BEFORE UPDATE ON file_changes FOR EACH ROW
BEGIN
    SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = 'statekeel: file_changes is append-only, UPDATE refused';
END;
