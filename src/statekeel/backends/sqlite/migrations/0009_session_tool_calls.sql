-- Tool calls of sessions: how many calls of a session's transcript still wait for a result and which
-- process left them (so that recovery finds those sessions through an index, and never answers a live
-- process's call), the journal of the calls run through sessions.run_tool, and the heartbeats of the
-- processes that leave calls waiting.

ALTER TABLE sessions ADD COLUMN open_calls INTEGER NOT NULL DEFAULT 0;
ALTER TABLE sessions ADD COLUMN calls_owner TEXT;
-- Sessions with messages written before this migration: their count is unknown (-1) until computed once.
UPDATE sessions SET open_calls = -1 WHERE head_seq > last_consolidated;
CREATE INDEX sessions_with_open_calls ON sessions (key) WHERE open_calls <> 0;

-- Two-phase: a row is committed as 'started' before the call's function runs; the call's result message
-- (at result_seq) is appended in the same transaction that settles it.
CREATE TABLE session_steps (
    session_key TEXT NOT NULL REFERENCES sessions (key) ON DELETE CASCADE,
    call_id     TEXT NOT NULL,
    status      TEXT NOT NULL CHECK (status IN ('started', 'succeeded', 'failed', 'interrupted')),
    attempt     INTEGER NOT NULL DEFAULT 1 CHECK (attempt >= 1),
    owner       TEXT NOT NULL,
    result_seq  INTEGER,
    error       TEXT,
    started_at  INTEGER NOT NULL,
    finished_at INTEGER,
    PRIMARY KEY (session_key, call_id)
) WITHOUT ROWID;
CREATE INDEX session_steps_started ON session_steps (session_key, call_id) WHERE status = 'started';

-- A process that leaves calls waiting renews its row while it runs; a row that expired (or was removed
-- when its store closed) means its calls may be answered as interrupted.
CREATE TABLE owner_heartbeats (
    owner      TEXT PRIMARY KEY NOT NULL,
    expires_at INTEGER NOT NULL
);
