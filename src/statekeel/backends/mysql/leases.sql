-- Session leases: the cross-process lock of a session, with a fencing token that only grows.

-- name: lease_ensure
-- A no-op update when the row exists: it takes the row's exclusive lock at once (a duplicate-key error
-- would take a shared one, and two takers upgrading theirs for lease_take would deadlock).
INSERT INTO session_leases (session_key) VALUES ($1) ON DUPLICATE KEY UPDATE session_key = session_key;

-- name: lease_take
-- Free (released), expired, or already ours (a release that never reached the database).
UPDATE session_leases SET owner = $1, token = token + 1, expires_at = $2
WHERE session_key = $3 AND (owner IS NULL OR expires_at <= $4 OR owner = $1);
SELECT owner, token, expires_at FROM session_leases WHERE session_key = $3;

-- name: lease_take_over
-- The holder's process is known to be dead: take the lease if it is still exactly that holder's.
UPDATE session_leases SET owner = $1, token = token + 1, expires_at = $2
WHERE session_key = $3 AND owner = $4 AND token = $5;
SELECT owner, token, expires_at FROM session_leases WHERE session_key = $3;

-- name: lease_get
SELECT owner, token, expires_at FROM session_leases WHERE session_key = $1;

-- name: lease_fence
-- FOR SHARE: a takeover (an UPDATE of this row) waits until the fenced write has committed.
SELECT owner, token FROM session_leases WHERE session_key = $1 LOCK IN SHARE MODE;

-- name: lease_renew
UPDATE session_leases SET expires_at = $1 WHERE session_key = $2 AND owner = $3 AND token = $4;
SELECT owner, token, expires_at FROM session_leases WHERE session_key = $2;

-- name: lease_release
UPDATE session_leases SET owner = NULL, expires_at = $1 WHERE session_key = $2 AND owner = $3 AND token = $4;
