-- Sessions, their append-only messages, and what compression moved out of them.
-- Keys use the "C" collation so that ordering (and cursors) match SQLite's byte order.

CREATE TABLE sessions (
    key               TEXT COLLATE "C" PRIMARY KEY,
    status            TEXT NOT NULL DEFAULT 'active' CHECK (status IN ('active', 'expired', 'archived')),
    metadata          JSONB NOT NULL DEFAULT '{}',
    last_consolidated BIGINT NOT NULL DEFAULT 0 CHECK (last_consolidated >= 0),
    head_seq          BIGINT NOT NULL DEFAULT 0 CHECK (head_seq >= last_consolidated),
    version           BIGINT NOT NULL DEFAULT 1,
    created_at        TIMESTAMPTZ NOT NULL,
    updated_at        TIMESTAMPTZ NOT NULL
);
CREATE INDEX sessions_by_updated ON sessions (updated_at DESC, key DESC);
CREATE INDEX sessions_by_status ON sessions (status, updated_at DESC, key DESC);

CREATE TABLE messages (
    session_key TEXT COLLATE "C" NOT NULL REFERENCES sessions (key) ON DELETE CASCADE,
    seq         BIGINT NOT NULL CHECK (seq >= 0),
    role        TEXT NOT NULL,
    payload     JSONB NOT NULL,
    created_at  TIMESTAMPTZ NOT NULL,
    PRIMARY KEY (session_key, seq)
);

CREATE TABLE compressions (
    session_key    TEXT COLLATE "C" NOT NULL REFERENCES sessions (key) ON DELETE CASCADE,
    compression_id TEXT NOT NULL,
    first_seq      BIGINT NOT NULL,
    upto_seq       BIGINT NOT NULL CHECK (upto_seq > first_seq),
    summary        TEXT NOT NULL,
    created_at     TIMESTAMPTZ NOT NULL,
    PRIMARY KEY (session_key, compression_id)
);

CREATE TABLE message_archive (
    session_key    TEXT COLLATE "C" NOT NULL,
    compression_id TEXT NOT NULL,
    seq            BIGINT NOT NULL,
    role           TEXT NOT NULL,
    payload        JSONB NOT NULL,
    created_at     TIMESTAMPTZ NOT NULL,
    PRIMARY KEY (session_key, seq),
    FOREIGN KEY (session_key, compression_id) REFERENCES compressions (session_key, compression_id)
        ON DELETE CASCADE
);
CREATE INDEX message_archive_by_compression ON message_archive (session_key, compression_id, seq);
