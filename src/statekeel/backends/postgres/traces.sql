-- Trace spans. Parameters ($1, $2 …) are in the same order as SQLite's ?1, ?2.

-- name: trace_span_upsert
-- A span recorded again (at its start, then at its end) replaces the earlier record.
INSERT INTO traces (trace_id, span_id, parent_span_id, name, kind, status, attributes, started_at, ended_at)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)
ON CONFLICT (trace_id, span_id) DO UPDATE SET
    parent_span_id = excluded.parent_span_id, name = excluded.name, kind = excluded.kind,
    status = excluded.status, attributes = excluded.attributes, started_at = excluded.started_at,
    ended_at = excluded.ended_at;

-- name: trace_counter_add
INSERT INTO trace_counters (name, value) VALUES ($1, $2)
ON CONFLICT (name) DO UPDATE SET value = trace_counters.value + excluded.value;

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
-- The traces of session $1: named after it, or with a span whose attributes name it; newest first.
SELECT trace_id, max(started_at) AS last_started FROM traces
WHERE trace_id = $1
   OR attributes -> 'session_key' = to_jsonb($1::text)
   OR attributes -> 'session.id' = to_jsonb($1::text)
GROUP BY trace_id ORDER BY last_started DESC, trace_id LIMIT $2;
