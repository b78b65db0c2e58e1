-- Retention: candidates oldest first from an index, and deletes that re-check what chose them.
-- Parameters ($1, $2 …) are in the same order as the other dialects' ($1 / ?1 …).

-- name: purge_traces_count
SELECT count(*) AS n FROM traces WHERE started_at < $1;

-- name: purge_traces_delete
DELETE FROM traces WHERE started_at < $1 ORDER BY started_at LIMIT $2;

-- name: purge_sessions_candidates
SELECT `key`, updated_at FROM sessions
WHERE status = 'archived' AND updated_at < $1 AND (updated_at, `key`) > ($2, $3)
ORDER BY updated_at, `key` LIMIT $4;

-- name: purge_session_messages_count
SELECT (SELECT count(*) FROM messages WHERE session_key = $1)
     + (SELECT count(*) FROM message_archive WHERE session_key = $1) AS n;

-- name: purge_session_files
-- The session's own records (no task), except each path's last one (files.check compares with it).
DELETE FROM file_changes
WHERE session_key = $1 AND task_id IS NULL
  AND seq < (SELECT max(f2.seq) FROM file_changes f2 WHERE f2.path = file_changes.path);

-- name: purge_session_files_count
SELECT count(*) AS n FROM file_changes f
WHERE f.session_key = $1 AND f.task_id IS NULL
  AND f.seq < (SELECT max(f2.seq) FROM file_changes f2 WHERE f2.path = f.path);

-- name: purge_session_delete
-- Messages, compressions and the archive follow by cascade; the session's lease row stays (its fencing
-- token only ever grows).
DELETE FROM sessions WHERE `key` = $1 AND status = 'archived' AND updated_at < $2;

-- name: purge_workflows_candidates
SELECT id, completed_at FROM workflows
WHERE status IN ('success', 'failed', 'cancelled') AND completed_at < $1 AND (completed_at, id) > ($2, $3)
ORDER BY completed_at, id LIMIT $4;

-- name: purge_workflow_unfinished_tasks
SELECT count(*) AS n FROM tasks WHERE workflow_id = $1 AND status NOT IN ('success', 'failed', 'cancelled');

-- name: purge_workflow_outside_children
SELECT count(*) AS n FROM tasks c JOIN tasks p ON c.parent_task_id = p.id
WHERE p.workflow_id = $1 AND (c.workflow_id IS NULL OR c.workflow_id <> $1);

-- name: purge_workflow_task_ids
SELECT id FROM tasks WHERE workflow_id = $1 ORDER BY id;

-- name: purge_workflow_steps_count
SELECT count(*) AS n FROM task_steps WHERE task_id IN (SELECT id FROM tasks WHERE workflow_id = $1);

-- name: purge_workflow_files
DELETE FROM file_changes
WHERE task_id IN (SELECT id FROM tasks WHERE workflow_id = $1)
  AND seq < (SELECT max(f2.seq) FROM file_changes f2 WHERE f2.path = file_changes.path);

-- name: purge_workflow_files_count
SELECT count(*) AS n FROM file_changes f
WHERE f.task_id IN (SELECT id FROM tasks WHERE workflow_id = $1)
  AND f.seq < (SELECT max(f2.seq) FROM file_changes f2 WHERE f2.path = f.path);

-- name: purge_workflow_delete
-- Its tasks, their steps and the workflow's steps follow by cascade.
DELETE FROM workflows WHERE id = $1 AND status IN ('success', 'failed', 'cancelled') AND completed_at < $2;

-- name: purge_tasks_candidates
SELECT id, parent_task_id, completed_at FROM tasks
WHERE status IN ('success', 'failed', 'cancelled') AND completed_at < $1 AND (completed_at, id) > ($2, $3)
  AND workflow_id IS NULL
ORDER BY completed_at, id LIMIT $4;

-- name: purge_task_children
SELECT id FROM tasks WHERE parent_task_id = $1;

-- name: purge_task_steps_count
SELECT count(*) AS n FROM task_steps WHERE task_id = $1;

-- name: purge_task_files
DELETE FROM file_changes
WHERE task_id = $1 AND seq < (SELECT max(f2.seq) FROM file_changes f2 WHERE f2.path = file_changes.path);

-- name: purge_task_files_count
SELECT count(*) AS n FROM file_changes f
WHERE f.task_id = $1 AND f.seq < (SELECT max(f2.seq) FROM file_changes f2 WHERE f2.path = f.path);

-- name: purge_task_delete
-- Its steps follow by cascade.
DELETE FROM tasks
WHERE id = $1 AND status IN ('success', 'failed', 'cancelled') AND completed_at < $2 AND workflow_id IS NULL
  AND NOT EXISTS (SELECT 1 FROM tasks c WHERE c.parent_task_id = $1);

-- name: purge_memories_forgotten
SELECT id, deleted_at FROM memories
WHERE deleted_at IS NOT NULL AND deleted_at < $1 AND (deleted_at, id) > ($2, $3)
ORDER BY deleted_at, id LIMIT $4;

-- name: purge_memories_expired
-- Those forgotten before $2 are the other listing's.
SELECT id, expires_at FROM memories
WHERE expires_at IS NOT NULL AND expires_at < $1 AND (expires_at, id) > ($3, $4)
  AND NOT (deleted_at IS NOT NULL AND deleted_at < $2)
ORDER BY expires_at, id LIMIT $5;

-- name: purge_memory_open_contradictions
SELECT count(*) AS n FROM memory_contradictions
WHERE resolved_at IS NULL AND (memory_a = $1 OR memory_b = $1);

-- name: purge_memory_events_count
SELECT count(*) AS n FROM memory_events WHERE memory_id = $1;

-- name: purge_memory_accesses
DELETE FROM memory_accesses WHERE memory_id = $1;

-- name: purge_memory_accesses_count
SELECT count(*) AS n FROM memory_accesses WHERE memory_id = $1;

-- name: purge_memory_delete
-- Its history and resolved contradictions follow by cascade; relations it produced keep their edge.
DELETE FROM memories
WHERE id = $1 AND ((deleted_at IS NOT NULL AND deleted_at < $2) OR (expires_at IS NOT NULL AND expires_at < $3));

-- name: purge_vector_sources_gone
SELECT source_id, gone_at FROM vector_sources
WHERE gone_at IS NOT NULL AND gone_at < $1 AND (gone_at, source_id) > ($2, $3)
ORDER BY gone_at, source_id LIMIT $4;

-- name: purge_task_candidate
SELECT id, parent_task_id, completed_at FROM tasks
WHERE id = $1 AND status IN ('success', 'failed', 'cancelled') AND completed_at < $2 AND workflow_id IS NULL;

-- name: purge_session_lock
-- The candidate, locked with the check that chose it; no row once it was reopened or written since.
-- FOR UPDATE: under read committed the check is made on the row's latest version, which stays until COMMIT.
SELECT `key` FROM sessions WHERE `key` = $1 AND status = 'archived' AND updated_at < $2
FOR UPDATE;

-- name: purge_workflow_lock
-- FOR UPDATE: under read committed the check is made on the row's latest version, which stays until COMMIT.
SELECT id FROM workflows
WHERE id = $1 AND status IN ('success', 'failed', 'cancelled') AND completed_at < $2
FOR UPDATE;

-- name: purge_workflow_tasks_lock
-- The workflow's tasks, locked in id order before their status is checked: none is retried, and none
-- gets a child, until the purge's COMMIT.
SELECT id FROM tasks WHERE workflow_id = $1 ORDER BY id
FOR UPDATE;

-- name: purge_task_lock
-- FOR UPDATE: under read committed the check is made on the row's latest version, which stays until COMMIT.
SELECT id FROM tasks
WHERE id = $1 AND status IN ('success', 'failed', 'cancelled') AND completed_at < $2 AND workflow_id IS NULL
FOR UPDATE;

-- name: purge_memory_lock
-- Forgotten before $2, or expired before $3: no row once it was put again (revived) since it was listed.
-- FOR UPDATE: under read committed the check is made on the row's latest version, which stays until COMMIT.
SELECT id FROM memories
WHERE id = $1 AND ((deleted_at IS NOT NULL AND deleted_at < $2) OR (expires_at IS NOT NULL AND expires_at < $3))
FOR UPDATE;

-- name: purge_vector_source_lock
-- A source gone before $2; no row once it was announced again (source_changed clears gone_at).
-- FOR UPDATE: under read committed the check is made on the row's latest version, which stays until COMMIT.
SELECT source_id FROM vector_sources WHERE source_id = $1 AND gone_at IS NOT NULL AND gone_at < $2
FOR UPDATE;

-- name: purge_vector_source_delete
DELETE FROM vector_sources WHERE source_id = $1 AND gone_at IS NOT NULL AND gone_at < $2;
