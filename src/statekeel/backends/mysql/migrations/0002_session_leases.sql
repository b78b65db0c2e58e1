-- Cross-process session locks: one lease row per session key, never deleted, so that the fencing token
-- only ever grows. A holder's writes carry its token; a token older than the row's is refused.
CREATE TABLE IF NOT EXISTS session_leases (
    session_key VARCHAR(512) NOT NULL PRIMARY KEY,
    owner       VARCHAR(512),
    token       BIGINT NOT NULL DEFAULT 0,
    expires_at  DATETIME(6) NOT NULL DEFAULT '1970-01-01 00:00:00'
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;
