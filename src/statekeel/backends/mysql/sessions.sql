-- Sessions, messages and the message archive. Parameters are numbered ($1, $2 …) in the same order as
-- PostgreSQL's $1, $2 so both dialects take the same arguments.

-- name: session_get
SELECT `key`, status, metadata, last_consolidated, head_seq, version, created_at, updated_at, open_calls,
       calls_owner, write_id
FROM sessions WHERE `key` = $1;

-- name: session_get_for_update
SELECT `key`, status, metadata, last_consolidated, head_seq, version, created_at, updated_at, open_calls,
       calls_owner, write_id
FROM sessions WHERE `key` = $1 FOR UPDATE;

-- name: session_insert
-- on duplicate PRIMARY
INSERT INTO sessions (`key`, metadata, created_at, updated_at) VALUES ($1, $2, $3, $4)
RETURNING `key`, status, metadata, last_consolidated, head_seq, version, created_at, updated_at, open_calls,
       calls_owner, write_id;

-- name: session_insert_missing
-- A no-op update when the session exists: the exclusive row lock session_advance_head needs next, taken
-- at once (see lease_ensure).
INSERT INTO sessions (`key`, metadata, created_at, updated_at) VALUES ($1, $2, $3, $4)
ON DUPLICATE KEY UPDATE `key` = `key`;

-- name: session_list
SELECT `key`, status, metadata, last_consolidated, head_seq, version, created_at, updated_at, open_calls,
       calls_owner, write_id
FROM sessions ORDER BY updated_at DESC, `key` DESC LIMIT $1;

-- name: session_list_after
SELECT `key`, status, metadata, last_consolidated, head_seq, version, created_at, updated_at, open_calls,
       calls_owner, write_id
FROM sessions WHERE (updated_at, `key`) < ($1, $2) ORDER BY updated_at DESC, `key` DESC LIMIT $3;

-- name: session_list_status
SELECT `key`, status, metadata, last_consolidated, head_seq, version, created_at, updated_at, open_calls,
       calls_owner, write_id
FROM sessions WHERE status = $1 ORDER BY updated_at DESC, `key` DESC LIMIT $2;

-- name: session_list_status_after
SELECT `key`, status, metadata, last_consolidated, head_seq, version, created_at, updated_at, open_calls,
       calls_owner, write_id
FROM sessions WHERE status = $1 AND (updated_at, `key`) < ($2, $3)
ORDER BY updated_at DESC, `key` DESC LIMIT $4;

-- name: session_update
UPDATE sessions
SET metadata = COALESCE($1, metadata), status = COALESCE($2, status), version = version + 1,
    updated_at = $3
WHERE `key` = $4 AND ($5 IS NULL OR version = $5);
SELECT `key`, status, metadata, last_consolidated, head_seq, version, created_at, updated_at, open_calls,
       calls_owner, write_id FROM sessions WHERE `key` = $4;

-- name: session_delete
DELETE FROM sessions WHERE `key` = $1;

-- name: session_advance_head
UPDATE sessions
SET head_seq = head_seq + $1, metadata = COALESCE($2, metadata),
    status = COALESCE($6, status), version = version + 1, updated_at = $3,
    -- A writer that reads the transcript says how many tool calls wait for a result and whose they are;
    -- one that does not ($9 NULL) makes the count unknown when it appends messages.
    open_calls = CASE WHEN $9 IS NOT NULL THEN $9 WHEN $1 > 0 THEN -1 ELSE open_calls END,
    calls_owner = CASE WHEN $9 IS NOT NULL THEN $10 ELSE calls_owner END,
    -- Which save this is, so that one whose answer was lost knows its own write (NULL: none given).
    write_id = $11
WHERE `key` = $4 AND head_seq = $5 AND ($7 IS NULL OR created_at = $7)
  AND ($8 IS NULL OR version = $8);
SELECT `key`, status, metadata, last_consolidated, head_seq, version, created_at, updated_at, open_calls,
       calls_owner, write_id FROM sessions WHERE `key` = $4;

-- name: session_set_consolidated
UPDATE sessions SET last_consolidated = $1, version = version + 1, updated_at = $2
WHERE `key` = $3 AND last_consolidated = $4;
SELECT `key`, status, metadata, last_consolidated, head_seq, version, created_at, updated_at, open_calls,
       calls_owner, write_id FROM sessions WHERE `key` = $3;

-- name: message_insert
INSERT INTO messages (session_key, seq, role, payload, created_at) VALUES ($1, $2, $3, $4, $5);

-- name: message_range
SELECT seq, role, payload, created_at FROM messages
WHERE session_key = $1 AND seq >= $2 AND seq < $3 ORDER BY seq;

-- name: message_range_open
SELECT seq, role, payload, created_at FROM messages
WHERE session_key = $1 AND seq >= $2 ORDER BY seq;

-- name: message_tail
SELECT seq, role, payload, created_at FROM messages
WHERE session_key = $1 ORDER BY seq DESC LIMIT $2;

-- name: message_delete_range
DELETE FROM messages WHERE session_key = $1 AND seq >= $2 AND seq < $3;

-- name: compression_insert
INSERT INTO compressions (session_key, compression_id, first_seq, upto_seq, summary, created_at)
VALUES ($1, $2, $3, $4, $5, $6);

-- name: archive_copy
INSERT INTO message_archive (session_key, compression_id, seq, role, payload, created_at)
SELECT session_key, $1, seq, role, payload, created_at FROM messages
WHERE session_key = $2 AND seq >= $3 AND seq < $4;

-- name: archive_all
SELECT a.compression_id, a.seq, a.payload, c.summary, a.created_at
FROM message_archive a JOIN compressions c USING (session_key, compression_id)
WHERE a.session_key = $1 ORDER BY a.seq;

-- name: archive_one
SELECT a.compression_id, a.seq, a.payload, c.summary, a.created_at
FROM message_archive a JOIN compressions c USING (session_key, compression_id)
WHERE a.session_key = $1 AND a.compression_id = $2 ORDER BY a.seq;

-- name: compression_list
SELECT compression_id, first_seq, upto_seq, summary FROM compressions
WHERE session_key = $1 ORDER BY first_seq;

-- name: session_transition_idle
-- updated_at is kept: a status change by retention is not activity.
UPDATE sessions SET status = $1, version = version + 1
WHERE status = $2 AND updated_at < $3;

-- name: archive_as_messages
SELECT seq, role, payload, created_at FROM message_archive WHERE session_key = $1 ORDER BY seq;

-- name: message_payload_array
-- The live history as one JSON array (the payloads' JSON text joined); the caller checks count and
-- bounds for density.
SELECT CONCAT('[', COALESCE(GROUP_CONCAT(payload ORDER BY seq SEPARATOR ','), ''), ']') AS arr, count(*) AS n,
       min(seq) AS lo, max(seq) AS hi
FROM messages WHERE session_key = $1 AND seq >= $2;

-- name: archive_payload_array
SELECT CONCAT('[', COALESCE(GROUP_CONCAT(payload ORDER BY seq SEPARATOR ','), ''), ']') AS arr, count(*) AS n,
       min(seq) AS lo, max(seq) AS hi
FROM message_archive WHERE session_key = $1;

