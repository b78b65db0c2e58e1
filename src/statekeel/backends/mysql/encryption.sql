-- Key rotation (statekeel.encryption): each table's encrypted columns, read in key order after a cursor
-- and written back re-sealed. Parameters ($1, $2 …) are in the same order as the other dialects' ($1 / ?1 …).

-- name: reseal_scan_messages
SELECT session_key, seq, payload FROM messages
WHERE (session_key, seq) > ($1, $2) ORDER BY session_key, seq LIMIT $3;

-- name: reseal_update_messages
UPDATE messages SET payload = $1 WHERE session_key = $2 AND seq = $3;

-- name: reseal_scan_message_archive
SELECT session_key, seq, payload FROM message_archive
WHERE (session_key, seq) > ($1, $2) ORDER BY session_key, seq LIMIT $3;

-- name: reseal_update_message_archive
UPDATE message_archive SET payload = $1 WHERE session_key = $2 AND seq = $3;

-- name: reseal_scan_rewound_messages
SELECT session_key, compression_id, seq, payload FROM rewound_messages
WHERE (session_key, compression_id, seq) > ($1, $2, $3) ORDER BY session_key, compression_id, seq LIMIT $4;

-- name: reseal_update_rewound_messages
UPDATE rewound_messages SET payload = $1 WHERE session_key = $2 AND compression_id = $3 AND seq = $4;

-- name: reseal_scan_task_steps
SELECT task_id, step_key, result FROM task_steps
WHERE (task_id, step_key) > ($1, $2) ORDER BY task_id, step_key LIMIT $3;

-- A step finished again since it was read keeps its new result.

-- name: reseal_update_task_steps
UPDATE task_steps SET result = $1 WHERE task_id = $2 AND step_key = $3 AND result = $4;

-- name: reseal_scan_approvals
SELECT id, args FROM approvals WHERE id > $1 ORDER BY id LIMIT $2;

-- name: reseal_update_approvals
UPDATE approvals SET args = $1 WHERE id = $2;

-- name: reseal_scan_memories
SELECT id, version, scope, content, data FROM memories WHERE id > $1 ORDER BY id LIMIT $2;

-- A memory changed since it was read keeps its new content.

-- name: reseal_update_memories
UPDATE memories SET content = $1, data = $2 WHERE id = $3 AND version = $4;

-- name: reseal_scan_memory_events
SELECT memory_id, version, state, (SELECT m.scope FROM memories m WHERE m.id = memory_events.memory_id) AS scope
FROM memory_events
WHERE (memory_id, version) > ($1, $2) ORDER BY memory_id, version LIMIT $3;

-- name: reseal_update_memory_events
UPDATE memory_events SET state = $1 WHERE memory_id = $2 AND version = $3;
