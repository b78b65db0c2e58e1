-- The file ledger. Parameters ($1, $2 …) are in the same order as the other dialects' ($1 / ?1 …).

-- name: file_last
SELECT seq, recorded_at FROM file_changes WHERE path = $1 ORDER BY seq DESC LIMIT 1;

-- name: file_insert
-- A concurrent writer may take the same seq: the primary key refuses ours, and the caller reads again.
-- on duplicate any
INSERT INTO file_changes (path, seq, checksum, size, action, task_id, session_key, recorded_at)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8)
RETURNING *;

-- name: file_list
SELECT * FROM file_changes
WHERE ($1 IS NULL OR task_id = $1) AND ($2 IS NULL OR session_key = $2)
  AND ($3 IS NULL OR path = $3)
ORDER BY recorded_at, path, seq LIMIT $4;

-- name: file_list_path
SELECT * FROM file_changes
WHERE path = $3 AND ($1 IS NULL OR task_id = $1) AND ($2 IS NULL OR session_key = $2)
ORDER BY seq LIMIT $4;

-- name: file_list_task
SELECT * FROM file_changes
WHERE task_id = $1 AND ($2 IS NULL OR session_key = $2) AND ($3 IS NULL OR path = $3)
ORDER BY recorded_at, path, seq LIMIT $4;

-- name: file_list_session
SELECT * FROM file_changes
WHERE session_key = $2 AND ($1 IS NULL OR task_id = $1) AND ($3 IS NULL OR path = $3)
ORDER BY recorded_at, path, seq LIMIT $4;

-- name: file_last_records
-- The newest record of each path after $1, in path order ($2 and $3 are None here).
SELECT f.* FROM file_changes f
WHERE f.path > $1 AND f.seq = (SELECT max(l.seq) FROM file_changes l WHERE l.path = f.path)
  AND $2 IS NULL AND $3 IS NULL
ORDER BY f.path LIMIT $4;

-- name: file_last_records_task
-- The same for the paths task $2 recorded (and session $3 too, when given).
SELECT f.* FROM file_changes f
WHERE f.path IN (SELECT t.path FROM file_changes t WHERE t.task_id = $2 AND t.path > $1)
  AND f.seq = (SELECT max(l.seq) FROM file_changes l WHERE l.path = f.path)
  AND ($3 IS NULL
       OR EXISTS (SELECT 1 FROM file_changes s WHERE s.session_key = $3 AND s.path = f.path))
ORDER BY f.path LIMIT $4;

-- name: file_last_records_session
-- The same for the paths session $3 recorded (task $2 is None here).
SELECT f.* FROM file_changes f
WHERE f.path IN (SELECT s.path FROM file_changes s WHERE s.session_key = $3 AND s.path > $1)
  AND f.seq = (SELECT max(l.seq) FROM file_changes l WHERE l.path = f.path)
  AND $2 IS NULL
ORDER BY f.path LIMIT $4;
