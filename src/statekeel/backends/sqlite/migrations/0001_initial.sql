-- Sessions, their append-only messages, and what compression moved out of them.
-- Timestamps are integer microseconds since the Unix epoch, UTC.

CREATE TABLE sessions (
    key               TEXT PRIMARY KEY NOT NULL,
    status            TEXT NOT NULL DEFAULT 'active' CHECK (status IN ('active', 'expired', 'archived')),
    metadata          TEXT NOT NULL DEFAULT '{}',
    last_consolidated INTEGER NOT NULL DEFAULT 0 CHECK (last_consolidated >= 0),
    head_seq          INTEGER NOT NULL DEFAULT 0 CHECK (head_seq >= last_consolidated),
    version           INTEGER NOT NULL DEFAULT 1,
    created_at        INTEGER NOT NULL,
    updated_at        INTEGER NOT NULL
);
CREATE INDEX sessions_by_updated ON sessions (updated_at DESC, key DESC);
CREATE INDEX sessions_by_status ON sessions (status, updated_at DESC, key DESC);

-- Clustered by (session_key, seq): loading a session reads contiguous pages.
CREATE TABLE messages (
    session_key TEXT NOT NULL REFERENCES sessions (key) ON DELETE CASCADE,
    seq         INTEGER NOT NULL CHECK (seq >= 0),
    role        TEXT NOT NULL,
    payload     TEXT NOT NULL,
    created_at  INTEGER NOT NULL,
    PRIMARY KEY (session_key, seq)
) WITHOUT ROWID;

-- One row per compression: its summary is stored once, not per archived message.
CREATE TABLE compressions (
    session_key    TEXT NOT NULL REFERENCES sessions (key) ON DELETE CASCADE,
    compression_id TEXT NOT NULL,
    first_seq      INTEGER NOT NULL,
    upto_seq       INTEGER NOT NULL CHECK (upto_seq > first_seq),
    summary        TEXT NOT NULL,
    created_at     INTEGER NOT NULL,
    PRIMARY KEY (session_key, compression_id)
);

CREATE TABLE message_archive (
    session_key    TEXT NOT NULL,
    compression_id TEXT NOT NULL,
    seq            INTEGER NOT NULL,
    role           TEXT NOT NULL,
    payload        TEXT NOT NULL,
    created_at     INTEGER NOT NULL,
    PRIMARY KEY (session_key, seq),
    FOREIGN KEY (session_key, compression_id) REFERENCES compressions (session_key, compression_id)
        ON DELETE CASCADE
) WITHOUT ROWID;
CREATE INDEX message_archive_by_compression ON message_archive (session_key, compression_id, seq);
