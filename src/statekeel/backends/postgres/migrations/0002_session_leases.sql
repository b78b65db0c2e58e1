-- Cross-process session locks: one lease row per session key, never deleted, so that the fencing token
-- only ever grows. A holder's writes carry its token; a token older than the row's is refused.
CREATE TABLE session_leases (
    session_key TEXT COLLATE "C" PRIMARY KEY,
    owner       TEXT,
    token       BIGINT NOT NULL DEFAULT 0,
    expires_at  TIMESTAMPTZ NOT NULL DEFAULT 'epoch'
);
