-- Sessions, their append-only messages, and what compression moved out of them.
-- Every table is InnoDB, utf8mb4 with the utf8mb4_bin collation: keys compare case-sensitively and order
-- by code point, which is UTF-8 byte order, as on SQLite and PostgreSQL ("C"). Timestamps are UTC
-- DATETIME(6); JSON is LONGTEXT holding the codec's JSON text. DDL is not transactional here: every
-- statement is safe to run again (see schema.py).

CREATE TABLE IF NOT EXISTS sessions (
    `key`             VARCHAR(512) NOT NULL PRIMARY KEY,
    status            VARCHAR(16) NOT NULL DEFAULT 'active' CHECK (status IN ('active', 'expired', 'archived')),
    metadata          LONGTEXT NOT NULL DEFAULT '{}',
    last_consolidated BIGINT NOT NULL DEFAULT 0 CHECK (last_consolidated >= 0),
    head_seq          BIGINT NOT NULL DEFAULT 0,
    version           BIGINT NOT NULL DEFAULT 1,
    created_at        DATETIME(6) NOT NULL,
    updated_at        DATETIME(6) NOT NULL,
    CONSTRAINT sessions_head CHECK (head_seq >= last_consolidated)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;
CREATE INDEX IF NOT EXISTS sessions_by_updated ON sessions (updated_at DESC, `key` DESC);
CREATE INDEX IF NOT EXISTS sessions_by_status ON sessions (status, updated_at DESC, `key` DESC);

CREATE TABLE IF NOT EXISTS messages (
    session_key VARCHAR(512) NOT NULL,
    seq         BIGINT NOT NULL CHECK (seq >= 0),
    role        VARCHAR(64) NOT NULL,
    payload     LONGTEXT NOT NULL,
    created_at  DATETIME(6) NOT NULL,
    PRIMARY KEY (session_key, seq),
    CONSTRAINT messages_session FOREIGN KEY (session_key) REFERENCES sessions (`key`) ON DELETE CASCADE
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;

CREATE TABLE IF NOT EXISTS compressions (
    session_key    VARCHAR(512) NOT NULL,
    compression_id VARCHAR(64) NOT NULL,
    first_seq      BIGINT NOT NULL,
    upto_seq       BIGINT NOT NULL,
    summary        LONGTEXT NOT NULL,
    created_at     DATETIME(6) NOT NULL,
    PRIMARY KEY (session_key, compression_id),
    CONSTRAINT compressions_range CHECK (upto_seq > first_seq),
    CONSTRAINT compressions_session FOREIGN KEY (session_key) REFERENCES sessions (`key`) ON DELETE CASCADE
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;

CREATE TABLE IF NOT EXISTS message_archive (
    session_key    VARCHAR(512) NOT NULL,
    compression_id VARCHAR(64) NOT NULL,
    seq            BIGINT NOT NULL,
    role           VARCHAR(64) NOT NULL,
    payload        LONGTEXT NOT NULL,
    created_at     DATETIME(6) NOT NULL,
    PRIMARY KEY (session_key, seq),
    INDEX message_archive_by_compression (session_key, compression_id, seq),
    CONSTRAINT message_archive_compression FOREIGN KEY (session_key, compression_id)
        REFERENCES compressions (session_key, compression_id) ON DELETE CASCADE
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;
