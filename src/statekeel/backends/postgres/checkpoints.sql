-- Graph checkpoints. Parameters ($1, $2 …) are in the same order as SQLite's ?1, ?2.
-- Lists of keys travel as one JSON array parameter: no SQL is built from the number of keys. Joins on such
-- lists are LATERAL primary-key lookups (LIMIT / OFFSET keep the planner from flattening them into a join
-- that scans the thread), so the plan does not depend on statistics, which a new table does not have.

-- name: checkpoint_exists
SELECT 1 AS found FROM checkpoints WHERE thread_id = $1 AND checkpoint_ns = $2 AND checkpoint_id = $3;

-- name: checkpoint_upsert
INSERT INTO checkpoints (thread_id, checkpoint_ns, checkpoint_id, parent_checkpoint_id, run_id, type,
                         checkpoint, metadata, channel_versions, created_at)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)
ON CONFLICT (thread_id, checkpoint_ns, checkpoint_id) DO UPDATE SET
    run_id = excluded.run_id, type = excluded.type, checkpoint = excluded.checkpoint,
    metadata = excluded.metadata, channel_versions = excluded.channel_versions;

-- name: checkpoint_blob_insert
INSERT INTO checkpoint_blobs (thread_id, checkpoint_ns, channel, version, type, blob)
VALUES ($1, $2, $3, $4, $5, $6)
ON CONFLICT (thread_id, checkpoint_ns, channel, version) DO NOTHING;

-- name: checkpoint_write_insert
INSERT INTO checkpoint_writes (thread_id, checkpoint_ns, checkpoint_id, task_id, idx, channel, type, blob,
                               task_path)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)
ON CONFLICT (thread_id, checkpoint_ns, checkpoint_id, task_id, idx) DO NOTHING;

-- name: checkpoint_write_upsert
INSERT INTO checkpoint_writes (thread_id, checkpoint_ns, checkpoint_id, task_id, idx, channel, type, blob,
                               task_path)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)
ON CONFLICT (thread_id, checkpoint_ns, checkpoint_id, task_id, idx) DO UPDATE SET
    channel = excluded.channel, type = excluded.type, blob = excluded.blob, task_path = excluded.task_path;

-- name: checkpoint_get
SELECT * FROM checkpoints WHERE thread_id = $1 AND checkpoint_ns = $2 AND checkpoint_id = $3;

-- name: checkpoint_latest
SELECT * FROM checkpoints WHERE thread_id = $1 AND checkpoint_ns = $2
ORDER BY checkpoint_id DESC LIMIT 1;

-- name: checkpoint_list_ns
-- One namespace of one thread (LangGraph's state history): $3 one checkpoint id, $4 metadata filter
-- (each key equal; a missing key counts as null), $5 only ids below it.
SELECT * FROM checkpoints c
WHERE thread_id = $1 AND checkpoint_ns = $2
  AND ($3::text IS NULL OR checkpoint_id = $3)
  AND ($5::text IS NULL OR checkpoint_id < $5)
  AND ($4::jsonb IS NULL OR NOT EXISTS (
      SELECT 1 FROM jsonb_each($4::jsonb) f WHERE COALESCE(c.metadata -> f.key, 'null'::jsonb) <> f.value))
ORDER BY checkpoint_id DESC LIMIT $6;

-- name: checkpoint_list_thread
-- Every namespace of one thread; the cursor is ($4 id, $5 namespace).
SELECT * FROM checkpoints c
WHERE thread_id = $1
  AND ($2::text IS NULL OR checkpoint_id = $2)
  AND ($4::text IS NULL OR (checkpoint_id, checkpoint_ns) < ($4, $5::text))
  AND ($3::jsonb IS NULL OR NOT EXISTS (
      SELECT 1 FROM jsonb_each($3::jsonb) f WHERE COALESCE(c.metadata -> f.key, 'null'::jsonb) <> f.value))
ORDER BY checkpoint_id DESC, checkpoint_ns DESC LIMIT $6;

-- name: checkpoint_list_all
-- Every thread; the cursor is ($2 id, $3 thread, $4 namespace).
SELECT * FROM checkpoints c
WHERE ($2::text IS NULL OR (checkpoint_id, thread_id, checkpoint_ns) < ($2, $3::text, $4::text))
  AND ($1::jsonb IS NULL OR NOT EXISTS (
      SELECT 1 FROM jsonb_each($1::jsonb) f WHERE COALESCE(c.metadata -> f.key, 'null'::jsonb) <> f.value))
ORDER BY checkpoint_id DESC, thread_id DESC, checkpoint_ns DESC LIMIT $5;

-- name: checkpoint_blobs_for
-- The channel values of the checkpoints named by $1, a JSON array of [thread_id, checkpoint_ns, id].
SELECT c.thread_id, c.checkpoint_ns, c.checkpoint_id, b.channel, b.type, b.blob
FROM jsonb_array_elements($1::jsonb) k
CROSS JOIN LATERAL (
    SELECT thread_id, checkpoint_ns, checkpoint_id, channel_versions FROM checkpoints
    WHERE thread_id = k ->> 0 AND checkpoint_ns = k ->> 1 AND checkpoint_id = k ->> 2 LIMIT 1) c
CROSS JOIN LATERAL jsonb_each_text(c.channel_versions) v
CROSS JOIN LATERAL (
    SELECT channel, type, blob FROM checkpoint_blobs
    WHERE thread_id = c.thread_id AND checkpoint_ns = c.checkpoint_ns AND channel = v.key
      AND version = v.value AND type <> 'empty' LIMIT 1) b;

-- name: checkpoint_writes_for
SELECT w.thread_id, w.checkpoint_ns, w.checkpoint_id, w.task_id, w.idx, w.channel, w.type, w.blob,
       w.task_path
FROM jsonb_array_elements($1::jsonb) k
CROSS JOIN LATERAL (
    SELECT * FROM checkpoint_writes
    WHERE thread_id = k ->> 0 AND checkpoint_ns = k ->> 1 AND checkpoint_id = k ->> 2 OFFSET 0) w
ORDER BY w.thread_id, w.checkpoint_ns, w.checkpoint_id, w.task_path, w.task_id, w.idx;

-- name: checkpoint_thread_delete
DELETE FROM checkpoints WHERE thread_id = $1;

-- name: checkpoint_thread_blobs_delete
DELETE FROM checkpoint_blobs WHERE thread_id = $1;

-- name: checkpoint_thread_writes_delete
DELETE FROM checkpoint_writes WHERE thread_id = $1;

-- name: checkpoint_blobs_unused_delete
-- Blobs of a thread that no checkpoint of it refers to any more.
DELETE FROM checkpoint_blobs b
WHERE b.thread_id = $1 AND NOT EXISTS (
    SELECT 1 FROM checkpoints c CROSS JOIN LATERAL jsonb_each_text(c.channel_versions) v
    WHERE c.thread_id = $1 AND c.checkpoint_ns = b.checkpoint_ns AND v.key = b.channel
      AND v.value = b.version);

-- name: checkpoint_runs_threads
SELECT DISTINCT thread_id FROM checkpoints
WHERE run_id = ANY (ARRAY(SELECT jsonb_array_elements_text($1::jsonb)));

-- name: checkpoint_runs_writes_delete
DELETE FROM checkpoint_writes w
USING checkpoints c
WHERE c.run_id = ANY (ARRAY(SELECT jsonb_array_elements_text($1::jsonb))) AND c.thread_id = w.thread_id
  AND c.checkpoint_ns = w.checkpoint_ns AND c.checkpoint_id = w.checkpoint_id;

-- name: checkpoint_runs_delete
DELETE FROM checkpoints WHERE run_id = ANY (ARRAY(SELECT jsonb_array_elements_text($1::jsonb)));

-- name: checkpoint_prune_writes_delete
-- Writes of every checkpoint of the thread but the newest of its namespace.
DELETE FROM checkpoint_writes w
WHERE w.thread_id = $1 AND w.checkpoint_id < (
    SELECT max(l.checkpoint_id) FROM checkpoints l
    WHERE l.thread_id = w.thread_id AND l.checkpoint_ns = w.checkpoint_ns);

-- name: checkpoint_prune_delete
DELETE FROM checkpoints c
WHERE c.thread_id = $1 AND c.checkpoint_id < (
    SELECT max(l.checkpoint_id) FROM checkpoints l
    WHERE l.thread_id = c.thread_id AND l.checkpoint_ns = c.checkpoint_ns);

-- name: checkpoint_thread_copy
INSERT INTO checkpoints (thread_id, checkpoint_ns, checkpoint_id, parent_checkpoint_id, run_id, type,
                         checkpoint, metadata, channel_versions, created_at)
SELECT $2, checkpoint_ns, checkpoint_id, parent_checkpoint_id, run_id, type, checkpoint, metadata,
       channel_versions, created_at
FROM checkpoints WHERE thread_id = $1
ON CONFLICT (thread_id, checkpoint_ns, checkpoint_id) DO NOTHING;

-- name: checkpoint_thread_blobs_copy
INSERT INTO checkpoint_blobs (thread_id, checkpoint_ns, channel, version, type, blob)
SELECT $2, checkpoint_ns, channel, version, type, blob FROM checkpoint_blobs WHERE thread_id = $1
ON CONFLICT (thread_id, checkpoint_ns, channel, version) DO NOTHING;

-- name: checkpoint_thread_writes_copy
INSERT INTO checkpoint_writes (thread_id, checkpoint_ns, checkpoint_id, task_id, idx, channel, type, blob,
                               task_path)
SELECT $2, checkpoint_ns, checkpoint_id, task_id, idx, channel, type, blob, task_path
FROM checkpoint_writes WHERE thread_id = $1
ON CONFLICT (thread_id, checkpoint_ns, checkpoint_id, task_id, idx) DO NOTHING;

-- name: checkpoint_lineage
-- A checkpoint and its ancestors by parent id, nearest first, at most $4 (which also ends a cycle).
WITH RECURSIVE line(checkpoint_id, parent_checkpoint_id, channel_versions, depth) AS (
    SELECT checkpoint_id, parent_checkpoint_id, channel_versions, 0 FROM checkpoints
    WHERE thread_id = $1 AND checkpoint_ns = $2 AND checkpoint_id = $3
    UNION ALL
    SELECT c.checkpoint_id, c.parent_checkpoint_id, c.channel_versions, line.depth + 1
    FROM line CROSS JOIN LATERAL (
        SELECT checkpoint_id, parent_checkpoint_id, channel_versions FROM checkpoints
        WHERE thread_id = $1 AND checkpoint_ns = $2 AND checkpoint_id = line.parent_checkpoint_id LIMIT 1) c
    WHERE line.depth + 1 < $4
)
SELECT checkpoint_id, parent_checkpoint_id, channel_versions FROM line ORDER BY depth;

-- name: checkpoint_lineage_blobs
-- The stored values among $3, a JSON array of [channel, version].
SELECT b.channel, b.version, b.type, b.blob
FROM jsonb_array_elements($3::jsonb) p
CROSS JOIN LATERAL (
    SELECT channel, version, type, blob FROM checkpoint_blobs
    WHERE thread_id = $1 AND checkpoint_ns = $2 AND channel = p ->> 0 AND version = p ->> 1
      AND type <> 'empty' LIMIT 1) b;

-- name: checkpoint_lineage_writes
-- The writes to the channels $4 of the checkpoints $3 (JSON arrays of text).
SELECT checkpoint_id, task_id, idx, channel, type, blob, task_path FROM checkpoint_writes
WHERE thread_id = $1 AND checkpoint_ns = $2
  AND checkpoint_id = ANY (ARRAY(SELECT jsonb_array_elements_text($3::jsonb)))
  AND channel = ANY (ARRAY(SELECT jsonb_array_elements_text($4::jsonb)))
ORDER BY checkpoint_id, task_path, task_id, idx;

-- name: checkpoint_threads
-- One row a thread, from the primary key (thread_id leads it); the most recently checkpointed first.
SELECT thread_id, count(*) AS checkpoints, count(DISTINCT checkpoint_ns) AS namespaces,
       max(checkpoint_id) AS latest_checkpoint_id, max(created_at) AS latest_at
FROM checkpoints GROUP BY thread_id ORDER BY max(created_at) DESC, thread_id LIMIT $1;
