-- Cross-process session locks: one lease row per session key, never deleted, so that the fencing token
-- only ever grows. A holder's writes carry its token; a token older than the row's is refused.
CREATE TABLE session_leases (
    session_key TEXT PRIMARY KEY NOT NULL,
    owner       TEXT,
    token       INTEGER NOT NULL DEFAULT 0,
    expires_at  INTEGER NOT NULL DEFAULT 0
);
