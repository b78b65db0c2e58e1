-- Graph checkpoints. Parameters ($1, $2 …) are in the same order as the other dialects' ($1 / ?1 …).
-- Lists of keys travel as one JSON array parameter, read with JSON_TABLE: no SQL is built from the number
-- of keys, and each key is a primary-key lookup.

-- name: checkpoint_exists
SELECT 1 AS found FROM checkpoints WHERE thread_id = $1 AND checkpoint_ns = $2 AND checkpoint_id = $3;

-- name: checkpoint_upsert
INSERT INTO checkpoints (thread_id, checkpoint_ns, checkpoint_id, parent_checkpoint_id, run_id, type,
                         checkpoint, metadata, channel_versions, created_at)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)
ON DUPLICATE KEY UPDATE
    run_id = VALUES(run_id), type = VALUES(type), checkpoint = VALUES(checkpoint),
    metadata = VALUES(metadata), channel_versions = VALUES(channel_versions);

-- name: checkpoint_blob_insert
-- A value already stored is kept (a no-op update, so that a checkpoint's blobs are one multi-row INSERT).
INSERT INTO checkpoint_blobs (thread_id, checkpoint_ns, channel, version, type, `blob`)
VALUES ($1, $2, $3, $4, $5, $6)
ON DUPLICATE KEY UPDATE type = type;

-- name: checkpoint_write_insert
-- A write already stored is kept (a no-op update: one multi-row INSERT per batch).
INSERT INTO checkpoint_writes (thread_id, checkpoint_ns, checkpoint_id, task_id, idx, channel, type, `blob`,
                               task_path)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)
ON DUPLICATE KEY UPDATE type = type;

-- name: checkpoint_write_upsert
INSERT INTO checkpoint_writes (thread_id, checkpoint_ns, checkpoint_id, task_id, idx, channel, type, `blob`,
                               task_path)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)
ON DUPLICATE KEY UPDATE
    channel = VALUES(channel), type = VALUES(type), `blob` = VALUES(`blob`), task_path = VALUES(task_path);

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
  AND ($3 IS NULL OR checkpoint_id = $3)
  AND ($5 IS NULL OR checkpoint_id < $5)
  AND ($4 IS NULL OR NOT EXISTS (
      SELECT 1 FROM JSON_TABLE(JSON_KEYS($4), '$[*]' COLUMNS (k VARCHAR(1024) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin PATH '$')) f
      WHERE NOT JSON_EQUALS(COALESCE(JSON_EXTRACT(c.metadata, CONCAT('$.', JSON_QUOTE(f.k))), 'null'),
                            JSON_EXTRACT($4, CONCAT('$.', JSON_QUOTE(f.k))))))
ORDER BY checkpoint_id DESC LIMIT $6;

-- name: checkpoint_list_thread
-- Every namespace of one thread; the cursor is ($4 id, $5 namespace).
SELECT * FROM checkpoints c
WHERE thread_id = $1
  AND ($2 IS NULL OR checkpoint_id = $2)
  AND ($4 IS NULL OR (checkpoint_id, checkpoint_ns) < ($4, $5))
  AND ($3 IS NULL OR NOT EXISTS (
      SELECT 1 FROM JSON_TABLE(JSON_KEYS($3), '$[*]' COLUMNS (k VARCHAR(1024) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin PATH '$')) f
      WHERE NOT JSON_EQUALS(COALESCE(JSON_EXTRACT(c.metadata, CONCAT('$.', JSON_QUOTE(f.k))), 'null'),
                            JSON_EXTRACT($3, CONCAT('$.', JSON_QUOTE(f.k))))))
ORDER BY checkpoint_id DESC, checkpoint_ns DESC LIMIT $6;

-- name: checkpoint_list_all
-- Every thread; the cursor is ($2 id, $3 thread, $4 namespace).
SELECT * FROM checkpoints c
WHERE ($2 IS NULL OR (checkpoint_id, thread_id, checkpoint_ns) < ($2, $3, $4))
  AND ($1 IS NULL OR NOT EXISTS (
      SELECT 1 FROM JSON_TABLE(JSON_KEYS($1), '$[*]' COLUMNS (k VARCHAR(1024) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin PATH '$')) f
      WHERE NOT JSON_EQUALS(COALESCE(JSON_EXTRACT(c.metadata, CONCAT('$.', JSON_QUOTE(f.k))), 'null'),
                            JSON_EXTRACT($1, CONCAT('$.', JSON_QUOTE(f.k))))))
ORDER BY checkpoint_id DESC, thread_id DESC, checkpoint_ns DESC LIMIT $5;

-- name: checkpoint_blobs_for
-- The channel values of the checkpoints named by $1, a JSON array of [thread_id, checkpoint_ns, id]:
-- primary-key lookups, each checkpoint's channel_versions read with JSON_TABLE.
SELECT c.thread_id, c.checkpoint_ns, c.checkpoint_id, b.channel, b.type, b.`blob`
FROM JSON_TABLE($1, '$[*]' COLUMNS (t VARCHAR(1024) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin PATH '$[0]', n VARCHAR(1024) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin PATH '$[1]', i VARCHAR(1024) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin PATH '$[2]')) k
JOIN checkpoints c ON c.thread_id = k.t AND c.checkpoint_ns = k.n AND c.checkpoint_id = k.i
JOIN JSON_TABLE(JSON_KEYS(c.channel_versions), '$[*]' COLUMNS (ch VARCHAR(1024) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin PATH '$')) v
JOIN checkpoint_blobs b ON b.thread_id = c.thread_id AND b.checkpoint_ns = c.checkpoint_ns
     AND b.channel = v.ch AND b.version = JSON_UNQUOTE(JSON_EXTRACT(c.channel_versions, CONCAT('$.', JSON_QUOTE(v.ch))))
WHERE b.type <> 'empty';

-- name: checkpoint_writes_for
SELECT w.thread_id, w.checkpoint_ns, w.checkpoint_id, w.task_id, w.idx, w.channel, w.type, w.`blob`,
       w.task_path
FROM JSON_TABLE($1, '$[*]' COLUMNS (t VARCHAR(1024) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin PATH '$[0]', n VARCHAR(1024) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin PATH '$[1]', i VARCHAR(1024) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin PATH '$[2]')) k
JOIN checkpoint_writes w ON w.thread_id = k.t AND w.checkpoint_ns = k.n AND w.checkpoint_id = k.i
ORDER BY w.thread_id, w.checkpoint_ns, w.checkpoint_id, w.task_path, w.task_id, w.idx;

-- name: checkpoint_thread_delete
DELETE FROM checkpoints WHERE thread_id = $1;

-- name: checkpoint_thread_blobs_delete
DELETE FROM checkpoint_blobs WHERE thread_id = $1;

-- name: checkpoint_thread_writes_delete
DELETE FROM checkpoint_writes WHERE thread_id = $1;

-- name: checkpoint_blobs_unused_delete
-- Blobs of a thread that no checkpoint of it refers to any more.
DELETE FROM checkpoint_blobs
WHERE thread_id = $1 AND NOT EXISTS (
    SELECT 1 FROM checkpoints c JOIN JSON_TABLE(JSON_KEYS(c.channel_versions), '$[*]' COLUMNS (ch VARCHAR(1024) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin PATH '$')) v
    WHERE c.thread_id = $1 AND c.checkpoint_ns = checkpoint_blobs.checkpoint_ns
      AND v.ch = checkpoint_blobs.channel AND JSON_UNQUOTE(JSON_EXTRACT(c.channel_versions, CONCAT('$.', JSON_QUOTE(v.ch)))) = checkpoint_blobs.version);

-- name: checkpoint_runs_threads
SELECT DISTINCT thread_id FROM checkpoints WHERE run_id IN (SELECT r.id FROM JSON_TABLE($1, '$[*]' COLUMNS (id VARCHAR(1024) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin PATH '$')) r);

-- name: checkpoint_runs_writes_delete
DELETE w FROM checkpoint_writes w
JOIN checkpoints c ON c.thread_id = w.thread_id AND c.checkpoint_ns = w.checkpoint_ns
     AND c.checkpoint_id = w.checkpoint_id
WHERE c.run_id IN (SELECT r.id FROM JSON_TABLE($1, '$[*]' COLUMNS (id VARCHAR(1024) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin PATH '$')) r);

-- name: checkpoint_runs_delete
DELETE FROM checkpoints WHERE run_id IN (SELECT r.id FROM JSON_TABLE($1, '$[*]' COLUMNS (id VARCHAR(1024) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin PATH '$')) r);

-- name: checkpoint_prune_writes_delete
-- Writes of every checkpoint of the thread but the newest of its namespace.
DELETE FROM checkpoint_writes
WHERE thread_id = $1 AND checkpoint_id < (
    SELECT max(l.checkpoint_id) FROM checkpoints l
    WHERE l.thread_id = checkpoint_writes.thread_id AND l.checkpoint_ns = checkpoint_writes.checkpoint_ns);

-- name: checkpoint_prune_delete
-- The newest of each namespace, read first: MariaDB deletes from a table it also reads only through a
-- derived table.
DELETE c FROM checkpoints c
JOIN (SELECT checkpoint_ns, max(checkpoint_id) AS newest FROM checkpoints WHERE thread_id = $1
      GROUP BY checkpoint_ns) l ON l.checkpoint_ns = c.checkpoint_ns
WHERE c.thread_id = $1 AND c.checkpoint_id < l.newest;

-- name: checkpoint_thread_copy
-- What the target thread holds already is kept; the count is of the checkpoints copied.
INSERT INTO checkpoints (thread_id, checkpoint_ns, checkpoint_id, parent_checkpoint_id, run_id, type,
                         checkpoint, metadata, channel_versions, created_at)
SELECT $2, s.checkpoint_ns, s.checkpoint_id, s.parent_checkpoint_id, s.run_id, s.type, s.checkpoint,
       s.metadata, s.channel_versions, s.created_at
FROM checkpoints s
WHERE s.thread_id = $1 AND NOT EXISTS (
    SELECT 1 FROM checkpoints t
    WHERE t.thread_id = $2 AND t.checkpoint_ns = s.checkpoint_ns AND t.checkpoint_id = s.checkpoint_id);

-- name: checkpoint_thread_blobs_copy
INSERT INTO checkpoint_blobs (thread_id, checkpoint_ns, channel, version, type, `blob`)
SELECT $2, s.checkpoint_ns, s.channel, s.version, s.type, s.`blob` FROM checkpoint_blobs s
WHERE s.thread_id = $1 AND NOT EXISTS (
    SELECT 1 FROM checkpoint_blobs t
    WHERE t.thread_id = $2 AND t.checkpoint_ns = s.checkpoint_ns AND t.channel = s.channel
      AND t.version = s.version);

-- name: checkpoint_thread_writes_copy
INSERT INTO checkpoint_writes (thread_id, checkpoint_ns, checkpoint_id, task_id, idx, channel, type, `blob`,
                               task_path)
SELECT $2, s.checkpoint_ns, s.checkpoint_id, s.task_id, s.idx, s.channel, s.type, s.`blob`, s.task_path
FROM checkpoint_writes s
WHERE s.thread_id = $1 AND NOT EXISTS (
    SELECT 1 FROM checkpoint_writes t
    WHERE t.thread_id = $2 AND t.checkpoint_ns = s.checkpoint_ns AND t.checkpoint_id = s.checkpoint_id
      AND t.task_id = s.task_id AND t.idx = s.idx);

-- name: checkpoint_lineage
-- A checkpoint and its ancestors by parent id, nearest first, at most $4 (which also ends a cycle).
WITH RECURSIVE line (checkpoint_id, parent_checkpoint_id, channel_versions, depth) AS (
    SELECT checkpoint_id, parent_checkpoint_id, channel_versions, 0 FROM checkpoints
    WHERE thread_id = $1 AND checkpoint_ns = $2 AND checkpoint_id = $3
    UNION ALL
    SELECT c.checkpoint_id, c.parent_checkpoint_id, c.channel_versions, line.depth + 1
    FROM line JOIN checkpoints c
      ON c.thread_id = $1 AND c.checkpoint_ns = $2 AND c.checkpoint_id = line.parent_checkpoint_id
    WHERE line.depth + 1 < $4
)
SELECT checkpoint_id, parent_checkpoint_id, channel_versions FROM line ORDER BY depth;

-- name: checkpoint_lineage_blobs
-- The stored values among $3, a JSON array of [channel, version].
SELECT b.channel, b.version, b.type, b.`blob`
FROM JSON_TABLE($3, '$[*]' COLUMNS (ch VARCHAR(1024) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin PATH '$[0]', ver VARCHAR(1024) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin PATH '$[1]')) p
JOIN checkpoint_blobs b ON b.thread_id = $1 AND b.checkpoint_ns = $2 AND b.channel = p.ch AND b.version = p.ver
WHERE b.type <> 'empty';

-- name: checkpoint_lineage_writes
-- The writes to the channels $4 of the checkpoints $3 (JSON arrays of text).
SELECT checkpoint_id, task_id, idx, channel, type, `blob`, task_path FROM checkpoint_writes
WHERE thread_id = $1 AND checkpoint_ns = $2
  AND checkpoint_id IN (SELECT r.id FROM JSON_TABLE($3, '$[*]' COLUMNS (id VARCHAR(1024) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin PATH '$')) r)
  AND channel IN (SELECT r.id FROM JSON_TABLE($4, '$[*]' COLUMNS (id VARCHAR(1024) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin PATH '$')) r)
ORDER BY checkpoint_id, task_path, task_id, idx;

-- name: checkpoint_threads
-- One row a thread, from the primary key (thread_id leads it); the most recently checkpointed first.
SELECT thread_id, count(*) AS checkpoints, count(DISTINCT checkpoint_ns) AS namespaces,
       max(checkpoint_id) AS latest_checkpoint_id, max(created_at) AS latest_at
FROM checkpoints GROUP BY thread_id ORDER BY max(created_at) DESC, thread_id LIMIT $1;
