-- Graph checkpoints. Parameters are numbered (?1, ?2 …) in the same order as PostgreSQL's.
-- Lists of keys travel as one JSON array parameter: no SQL is built from the number of keys.

-- name: checkpoint_exists
SELECT 1 AS found FROM checkpoints WHERE thread_id = ?1 AND checkpoint_ns = ?2 AND checkpoint_id = ?3;

-- name: checkpoint_upsert
INSERT INTO checkpoints (thread_id, checkpoint_ns, checkpoint_id, parent_checkpoint_id, run_id, type,
                         checkpoint, metadata, channel_versions, created_at)
VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10)
ON CONFLICT (thread_id, checkpoint_ns, checkpoint_id) DO UPDATE SET
    run_id = excluded.run_id, type = excluded.type, checkpoint = excluded.checkpoint,
    metadata = excluded.metadata, channel_versions = excluded.channel_versions;

-- name: checkpoint_blob_insert
INSERT INTO checkpoint_blobs (thread_id, checkpoint_ns, channel, version, type, blob)
VALUES (?1, ?2, ?3, ?4, ?5, ?6)
ON CONFLICT (thread_id, checkpoint_ns, channel, version) DO NOTHING;

-- name: checkpoint_write_insert
INSERT INTO checkpoint_writes (thread_id, checkpoint_ns, checkpoint_id, task_id, idx, channel, type, blob,
                               task_path)
VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)
ON CONFLICT (thread_id, checkpoint_ns, checkpoint_id, task_id, idx) DO NOTHING;

-- name: checkpoint_write_upsert
INSERT INTO checkpoint_writes (thread_id, checkpoint_ns, checkpoint_id, task_id, idx, channel, type, blob,
                               task_path)
VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)
ON CONFLICT (thread_id, checkpoint_ns, checkpoint_id, task_id, idx) DO UPDATE SET
    channel = excluded.channel, type = excluded.type, blob = excluded.blob, task_path = excluded.task_path;

-- name: checkpoint_get
SELECT * FROM checkpoints WHERE thread_id = ?1 AND checkpoint_ns = ?2 AND checkpoint_id = ?3;

-- name: checkpoint_latest
SELECT * FROM checkpoints WHERE thread_id = ?1 AND checkpoint_ns = ?2
ORDER BY checkpoint_id DESC LIMIT 1;

-- name: checkpoint_list_ns
-- One namespace of one thread (LangGraph's state history): ?3 one checkpoint id, ?4 metadata filter,
-- ?5 only ids below it.
SELECT * FROM checkpoints c
WHERE thread_id = ?1 AND checkpoint_ns = ?2
  AND (?3 IS NULL OR checkpoint_id = ?3)
  AND (?5 IS NULL OR checkpoint_id < ?5)
  AND (?4 IS NULL OR NOT EXISTS (
      SELECT 1 FROM json_each(?4) f
      WHERE NOT EXISTS (
          SELECT 1 FROM json_each(c.metadata) m
          WHERE m.key = f.key AND m.value IS f.value
            AND (m.type = f.type OR (m.type IN ('integer', 'real') AND f.type IN ('integer', 'real'))))
        AND NOT (f.type = 'null' AND NOT EXISTS (SELECT 1 FROM json_each(c.metadata) m WHERE m.key = f.key))))
ORDER BY checkpoint_id DESC LIMIT ?6;

-- name: checkpoint_list_thread
-- Every namespace of one thread; the cursor is (?4 id, ?5 namespace).
SELECT * FROM checkpoints c
WHERE thread_id = ?1
  AND (?2 IS NULL OR checkpoint_id = ?2)
  AND (?4 IS NULL OR (checkpoint_id, checkpoint_ns) < (?4, ?5))
  AND (?3 IS NULL OR NOT EXISTS (
      SELECT 1 FROM json_each(?3) f
      WHERE NOT EXISTS (
          SELECT 1 FROM json_each(c.metadata) m
          WHERE m.key = f.key AND m.value IS f.value
            AND (m.type = f.type OR (m.type IN ('integer', 'real') AND f.type IN ('integer', 'real'))))
        AND NOT (f.type = 'null' AND NOT EXISTS (SELECT 1 FROM json_each(c.metadata) m WHERE m.key = f.key))))
ORDER BY checkpoint_id DESC, checkpoint_ns DESC LIMIT ?6;

-- name: checkpoint_list_all
-- Every thread; the cursor is (?2 id, ?3 thread, ?4 namespace).
SELECT * FROM checkpoints c
WHERE (?2 IS NULL OR (checkpoint_id, thread_id, checkpoint_ns) < (?2, ?3, ?4))
  AND (?1 IS NULL OR NOT EXISTS (
      SELECT 1 FROM json_each(?1) f
      WHERE NOT EXISTS (
          SELECT 1 FROM json_each(c.metadata) m
          WHERE m.key = f.key AND m.value IS f.value
            AND (m.type = f.type OR (m.type IN ('integer', 'real') AND f.type IN ('integer', 'real'))))
        AND NOT (f.type = 'null' AND NOT EXISTS (SELECT 1 FROM json_each(c.metadata) m WHERE m.key = f.key))))
ORDER BY checkpoint_id DESC, thread_id DESC, checkpoint_ns DESC LIMIT ?5;

-- name: checkpoint_blobs_for
-- The channel values of the checkpoints named by ?1, a JSON array of [thread_id, checkpoint_ns, id].
-- CROSS JOIN fixes the order: keys, their checkpoints, their versions, then one blob lookup each.
SELECT c.thread_id, c.checkpoint_ns, c.checkpoint_id, b.channel, b.type, b.blob
FROM json_each(?1) k
CROSS JOIN checkpoints c ON c.thread_id = json_extract(k.value, '$[0]')
    AND c.checkpoint_ns = json_extract(k.value, '$[1]') AND c.checkpoint_id = json_extract(k.value, '$[2]')
CROSS JOIN json_each(c.channel_versions) v
CROSS JOIN checkpoint_blobs b ON b.thread_id = c.thread_id AND b.checkpoint_ns = c.checkpoint_ns
    AND b.channel = v.key AND b.version = v.value
WHERE b.type <> 'empty';

-- name: checkpoint_writes_for
SELECT w.thread_id, w.checkpoint_ns, w.checkpoint_id, w.task_id, w.idx, w.channel, w.type, w.blob,
       w.task_path
FROM json_each(?1) k
CROSS JOIN checkpoint_writes w ON w.thread_id = json_extract(k.value, '$[0]')
    AND w.checkpoint_ns = json_extract(k.value, '$[1]') AND w.checkpoint_id = json_extract(k.value, '$[2]')
ORDER BY w.thread_id, w.checkpoint_ns, w.checkpoint_id, w.task_path, w.task_id, w.idx;

-- name: checkpoint_thread_delete
DELETE FROM checkpoints WHERE thread_id = ?1;

-- name: checkpoint_thread_blobs_delete
DELETE FROM checkpoint_blobs WHERE thread_id = ?1;

-- name: checkpoint_thread_writes_delete
DELETE FROM checkpoint_writes WHERE thread_id = ?1;

-- name: checkpoint_blobs_unused_delete
-- Blobs of a thread that no checkpoint of it refers to any more.
DELETE FROM checkpoint_blobs
WHERE thread_id = ?1 AND (checkpoint_ns, channel, version) NOT IN (
    SELECT c.checkpoint_ns, v.key, v.value FROM checkpoints c, json_each(c.channel_versions) v
    WHERE c.thread_id = ?1);

-- name: checkpoint_runs_threads
SELECT DISTINCT thread_id FROM checkpoints WHERE run_id IN (SELECT value FROM json_each(?1));

-- name: checkpoint_runs_writes_delete
DELETE FROM checkpoint_writes
WHERE EXISTS (
    SELECT 1 FROM checkpoints c
    WHERE c.run_id IN (SELECT value FROM json_each(?1)) AND c.thread_id = checkpoint_writes.thread_id
      AND c.checkpoint_ns = checkpoint_writes.checkpoint_ns
      AND c.checkpoint_id = checkpoint_writes.checkpoint_id);

-- name: checkpoint_runs_delete
DELETE FROM checkpoints WHERE run_id IN (SELECT value FROM json_each(?1));

-- name: checkpoint_prune_writes_delete
-- Writes of every checkpoint of the thread but the newest of its namespace.
DELETE FROM checkpoint_writes
WHERE thread_id = ?1 AND checkpoint_id < (
    SELECT max(l.checkpoint_id) FROM checkpoints l
    WHERE l.thread_id = checkpoint_writes.thread_id AND l.checkpoint_ns = checkpoint_writes.checkpoint_ns);

-- name: checkpoint_prune_delete
DELETE FROM checkpoints
WHERE thread_id = ?1 AND checkpoint_id < (
    SELECT max(l.checkpoint_id) FROM checkpoints l
    WHERE l.thread_id = checkpoints.thread_id AND l.checkpoint_ns = checkpoints.checkpoint_ns);

-- name: checkpoint_thread_copy
INSERT INTO checkpoints (thread_id, checkpoint_ns, checkpoint_id, parent_checkpoint_id, run_id, type,
                         checkpoint, metadata, channel_versions, created_at)
SELECT ?2, checkpoint_ns, checkpoint_id, parent_checkpoint_id, run_id, type, checkpoint, metadata,
       channel_versions, created_at
FROM checkpoints WHERE thread_id = ?1
ON CONFLICT (thread_id, checkpoint_ns, checkpoint_id) DO NOTHING;

-- name: checkpoint_thread_blobs_copy
INSERT INTO checkpoint_blobs (thread_id, checkpoint_ns, channel, version, type, blob)
SELECT ?2, checkpoint_ns, channel, version, type, blob FROM checkpoint_blobs WHERE thread_id = ?1
ON CONFLICT (thread_id, checkpoint_ns, channel, version) DO NOTHING;

-- name: checkpoint_thread_writes_copy
INSERT INTO checkpoint_writes (thread_id, checkpoint_ns, checkpoint_id, task_id, idx, channel, type, blob,
                               task_path)
SELECT ?2, checkpoint_ns, checkpoint_id, task_id, idx, channel, type, blob, task_path
FROM checkpoint_writes WHERE thread_id = ?1
ON CONFLICT (thread_id, checkpoint_ns, checkpoint_id, task_id, idx) DO NOTHING;

-- name: checkpoint_lineage
-- A checkpoint and its ancestors by parent id, nearest first, at most ?4 (which also ends a cycle).
WITH RECURSIVE line(checkpoint_id, parent_checkpoint_id, channel_versions, depth) AS (
    SELECT checkpoint_id, parent_checkpoint_id, channel_versions, 0 FROM checkpoints
    WHERE thread_id = ?1 AND checkpoint_ns = ?2 AND checkpoint_id = ?3
    UNION ALL
    SELECT c.checkpoint_id, c.parent_checkpoint_id, c.channel_versions, line.depth + 1
    FROM line JOIN checkpoints c ON c.thread_id = ?1 AND c.checkpoint_ns = ?2
        AND c.checkpoint_id = line.parent_checkpoint_id
    WHERE line.depth + 1 < ?4
)
SELECT checkpoint_id, parent_checkpoint_id, channel_versions FROM line ORDER BY depth;

-- name: checkpoint_lineage_blobs
-- The stored values among ?3, a JSON array of [channel, version]. CROSS JOIN keeps the list outer: one
-- primary-key lookup per pair, not a scan of the thread's blobs per pair.
SELECT b.channel, b.version, b.type, b.blob
FROM json_each(?3) p
CROSS JOIN checkpoint_blobs b ON b.thread_id = ?1 AND b.checkpoint_ns = ?2
    AND b.channel = json_extract(p.value, '$[0]') AND b.version = json_extract(p.value, '$[1]')
WHERE b.type <> 'empty';

-- name: checkpoint_lineage_writes
-- The writes to the channels ?4 of the checkpoints ?3 (JSON arrays of text).
SELECT checkpoint_id, task_id, idx, channel, type, blob, task_path FROM checkpoint_writes
WHERE thread_id = ?1 AND checkpoint_ns = ?2 AND checkpoint_id IN (SELECT value FROM json_each(?3))
  AND channel IN (SELECT value FROM json_each(?4))
ORDER BY checkpoint_id, task_path, task_id, idx;

-- name: checkpoint_threads
-- One row a thread, from the primary key (thread_id leads it); the most recently checkpointed first.
SELECT thread_id, count(*) AS checkpoints, count(DISTINCT checkpoint_ns) AS namespaces,
       max(checkpoint_id) AS latest_checkpoint_id, max(created_at) AS latest_at
FROM checkpoints GROUP BY thread_id ORDER BY max(created_at) DESC, thread_id LIMIT ?1;
