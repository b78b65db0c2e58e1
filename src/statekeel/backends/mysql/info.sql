-- Counts for store.info(): each one a COUNT over an indexed column (statuses lead the indexes
-- sessions_by_status, tasks_claim and workflows_by_status; approvals_pending is a partial index).

-- name: info_sessions_by_status
SELECT status, count(*) AS n FROM sessions GROUP BY status;

-- name: info_tasks_by_status
SELECT status, count(*) AS n FROM tasks GROUP BY status;

-- name: info_workflows_by_status
SELECT status, count(*) AS n FROM workflows GROUP BY status;

-- name: info_approvals_pending
SELECT count(*) AS n FROM approvals WHERE status = 'pending' AND (expires_at IS NULL OR expires_at > $1);

-- name: info_audit_entries
-- The head's sequence number (the primary key): entries are numbered from 1 and never deleted.
SELECT coalesce(max(seq), 0) AS n FROM audit_log;

-- name: info_memories_live
SELECT count(*) AS n FROM memories WHERE deleted_at IS NULL AND superseded_by IS NULL;

-- name: info_contradictions_open
-- Read from the partial index memory_contradictions_open.
SELECT count(*) AS n FROM memory_contradictions WHERE resolved_at IS NULL;

-- name: info_file_changes
SELECT count(*) AS n FROM file_changes;

-- name: info_checkpoint_threads
-- LangGraph threads with a checkpoint: read from the primary key, which thread_id leads.
SELECT count(DISTINCT thread_id) AS n FROM checkpoints;

-- name: info_checkpoints
SELECT count(*) AS n FROM checkpoints;
