-- Trace spans. Parameters ($1, $2 …) are in the same order as the other dialects' ($1 / ?1 …).

-- name: trace_span_upsert
-- A span recorded again (at its start, then at its end) replaces the earlier record.
INSERT INTO traces (trace_id, span_id, parent_span_id, name, kind, status, attributes, started_at, ended_at)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)
ON DUPLICATE KEY UPDATE
    parent_span_id = VALUES(parent_span_id), name = VALUES(name), kind = VALUES(kind),
    status = VALUES(status), attributes = VALUES(attributes), started_at = VALUES(started_at),
    ended_at = VALUES(ended_at);

-- name: trace_counter_add
INSERT INTO trace_counters (name, value) VALUES ($1, $2)
ON DUPLICATE KEY UPDATE value = value + VALUES(value);

-- name: trace_counter_get
SELECT value FROM trace_counters WHERE name = $1;

-- name: trace_get
SELECT * FROM traces WHERE trace_id = $1 ORDER BY started_at, span_id;

-- name: trace_query
SELECT * FROM traces
WHERE started_at >= $1 AND (started_at, trace_id, span_id) < ($2, $3, $4)
ORDER BY started_at DESC, trace_id DESC, span_id DESC LIMIT $5;

-- name: trace_query_name
SELECT * FROM traces
WHERE name = $6 AND started_at >= $1 AND (started_at, trace_id, span_id) < ($2, $3, $4)
ORDER BY started_at DESC, trace_id DESC, span_id DESC LIMIT $5;

-- name: trace_query_status
SELECT * FROM traces
WHERE status = $6 AND started_at >= $1 AND (started_at, trace_id, span_id) < ($2, $3, $4)
ORDER BY started_at DESC, trace_id DESC, span_id DESC LIMIT $5;

-- name: trace_query_name_status
SELECT * FROM traces
WHERE name = $6 AND status = $7 AND started_at >= $1 AND (started_at, trace_id, span_id) < ($2, $3, $4)
ORDER BY started_at DESC, trace_id DESC, span_id DESC LIMIT $5;

-- name: trace_ids_of_session
-- The traces of session $1: named after it, or with a span whose attributes name it (as a string);
-- newest first.
SELECT trace_id, max(started_at) AS last_started FROM traces
WHERE trace_id = $1
   OR (JSON_TYPE(JSON_EXTRACT(attributes, '$."session_key"')) = 'STRING'
       AND JSON_VALUE(attributes, '$."session_key"') = CAST($1 AS CHAR CHARACTER SET utf8mb4) COLLATE utf8mb4_bin)
   OR (JSON_TYPE(JSON_EXTRACT(attributes, '$."session.id"')) = 'STRING'
       AND JSON_VALUE(attributes, '$."session.id"') = CAST($1 AS CHAR CHARACTER SET utf8mb4) COLLATE utf8mb4_bin)
GROUP BY trace_id ORDER BY last_started DESC, trace_id LIMIT $2;
