-- Sessions' tool calls: the journal of calls run through run_tool, the sessions with calls waiting for a
-- result, and the heartbeats of the processes that leave calls waiting. Parameters ($1, $2 …) are in the
-- same order as the other dialects' ($1 / ?1 …).

-- name: session_set_open_calls
-- Only the derived count and its owner change: not the version, not updated_at.
UPDATE sessions SET open_calls = $1, calls_owner = $2
WHERE `key` = $3 AND head_seq = $4 AND created_at = $5;

-- name: sessions_open_calls_first
SELECT `key`, status, head_seq, created_at, open_calls, calls_owner FROM sessions
WHERE open_calls <> 0 ORDER BY `key` LIMIT $1;

-- name: sessions_open_calls_after
SELECT `key`, status, head_seq, created_at, open_calls, calls_owner FROM sessions
WHERE open_calls <> 0 AND `key` > $1 ORDER BY `key` LIMIT $2;

-- name: session_step_get
SELECT * FROM session_steps WHERE session_key = $1 AND call_id = $2;

-- name: session_steps_all
SELECT * FROM session_steps WHERE session_key = $1 ORDER BY call_id;

-- name: session_steps_in_status
SELECT * FROM session_steps WHERE session_key = $1 AND status = $2 ORDER BY call_id;

-- name: session_step_insert
-- on duplicate PRIMARY
INSERT INTO session_steps (session_key, call_id, status, attempt, owner, started_at)
VALUES ($1, $2, 'started', 1, $3, $4)
RETURNING *;

-- name: session_step_restart
UPDATE session_steps
SET status = 'started', attempt = attempt + 1, owner = $1, started_at = $2, finished_at = NULL,
    result_seq = NULL, error = NULL
WHERE session_key = $3 AND call_id = $4 AND attempt = $5;
SELECT * FROM session_steps WHERE session_key = $3 AND call_id = $4;

-- name: session_step_finish
UPDATE session_steps SET status = $1, result_seq = $2, error = $3, finished_at = $4
WHERE session_key = $5 AND call_id = $6 AND status = 'started' AND attempt = $7;
SELECT * FROM session_steps WHERE session_key = $5 AND call_id = $6;

-- name: session_step_settle
INSERT INTO session_steps (session_key, call_id, status, attempt, owner, result_seq, started_at, finished_at)
VALUES ($1, $2, $3, 1, $4, $5, $6, $6)
ON DUPLICATE KEY UPDATE
    status = VALUES(status), result_seq = VALUES(result_seq), error = NULL,
    finished_at = VALUES(finished_at);
SELECT * FROM session_steps WHERE session_key = $1 AND call_id = $2;

-- name: heartbeat_put
INSERT INTO owner_heartbeats (owner, expires_at) VALUES ($1, $2)
ON DUPLICATE KEY UPDATE expires_at = VALUES(expires_at);

-- name: heartbeat_delete
DELETE FROM owner_heartbeats WHERE owner = $1;

-- name: heartbeat_get
SELECT expires_at FROM owner_heartbeats WHERE owner = $1;

-- name: heartbeat_purge
DELETE FROM owner_heartbeats WHERE expires_at < $1;
