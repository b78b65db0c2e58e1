-- Tool calls of sessions: how many calls of a session's transcript still wait for a result and which
-- process left them (so that recovery finds those sessions through an index, and never answers a live
-- process's call), the journal of the calls run through sessions.run_tool, and the heartbeats of the
-- processes that leave calls waiting.

ALTER TABLE sessions ADD COLUMN IF NOT EXISTS open_calls INTEGER NOT NULL DEFAULT 0;
ALTER TABLE sessions ADD COLUMN IF NOT EXISTS calls_owner VARCHAR(512);
-- Sessions with messages written before this migration: their count is unknown (-1) until computed once.
-- Safe to run again: until this migration is recorded, no statekeel of this version writes a count.
UPDATE sessions SET open_calls = -1 WHERE head_seq > last_consolidated AND open_calls = 0;
CREATE INDEX IF NOT EXISTS sessions_with_open_calls ON sessions (open_calls);

-- Two-phase: a row is committed as 'started' before the call's function runs; the call's result message
-- (at result_seq) is appended in the same transaction that settles it.
CREATE TABLE IF NOT EXISTS session_steps (
    session_key VARCHAR(512) NOT NULL,
    call_id     VARCHAR(255) NOT NULL,
    status      VARCHAR(16) NOT NULL CHECK (status IN ('started', 'succeeded', 'failed', 'interrupted')),
    attempt     INTEGER NOT NULL DEFAULT 1 CHECK (attempt >= 1),
    owner       VARCHAR(512) NOT NULL,
    result_seq  BIGINT,
    error       LONGTEXT,
    started_at  DATETIME(6) NOT NULL,
    finished_at DATETIME(6),
    PRIMARY KEY (session_key, call_id),
    INDEX session_steps_started (status, session_key),
    CONSTRAINT session_steps_session FOREIGN KEY (session_key) REFERENCES sessions (`key`) ON DELETE CASCADE
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;

-- A process that leaves calls waiting renews its row while it runs; a row that expired (or was removed
-- when its store closed) means its calls may be answered as interrupted.
CREATE TABLE IF NOT EXISTS owner_heartbeats (
    owner      VARCHAR(512) NOT NULL PRIMARY KEY,
    expires_at DATETIME(6) NOT NULL
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;
