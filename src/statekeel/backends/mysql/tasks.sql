-- Tasks and their step journal. Parameters ($1, $2 …) are in the same order as the other dialects' ($1 / ?1 …).

-- name: task_insert
-- on duplicate tasks_idempotency_key
INSERT INTO tasks (id, workflow_id, parent_task_id, title, description, status, priority, max_retries,
                   metadata, idempotency_key, created_at, updated_at, not_before)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $11, $12)
RETURNING *;

-- name: task_get
SELECT * FROM tasks WHERE id = $1;

-- name: task_by_idempotency_key
SELECT * FROM tasks WHERE idempotency_key = $1;

-- name: task_list
SELECT * FROM tasks
WHERE ($1 IS NULL OR workflow_id = $1) AND ($2 IS NULL OR status = $2) AND (created_at, id) > ($3, $4)
ORDER BY created_at, id LIMIT $5;

-- name: task_update
UPDATE tasks
SET status = $1, retry_count = $2, lease_expires_at = $3, started_at = $4, completed_at = $5,
    result = COALESCE($6, result), error = COALESCE($7, error), updated_at = $8, version = version + 1,
    transition_id = $13, not_before = COALESCE($14, not_before),
    -- Entering running without claim() grants no lease: a new epoch and no owner fence out whoever
    -- held the task before (a zombie worker must not resume with its old epoch).
    lease_owner = CASE WHEN $1 = 'running' THEN NULL ELSE lease_owner END,
    lease_epoch = lease_epoch + (CASE WHEN $1 = 'running' THEN 1 ELSE 0 END)
WHERE id = $9 AND status = $10 AND version = $11
  -- A fenced caller (a worker with its lease) is refused once the lease has expired at $12, its
  -- clock: whether or not expire_leases() has run.
  AND ($12 IS NULL OR lease_expires_at IS NULL OR lease_expires_at > $12);
SELECT * FROM tasks WHERE id = $9;

-- name: task_claim
-- The first queued task no other claimer holds (its id becomes $4), then the claim and the claimed row.
SELECT id FROM tasks WHERE status = 'queued' AND (not_before IS NULL OR not_before <= $3)
ORDER BY priority DESC, created_at, id LIMIT 1 FOR UPDATE SKIP LOCKED;
UPDATE tasks
SET status = 'running', lease_owner = $1, lease_expires_at = $2, lease_epoch = lease_epoch + 1,
    version = version + 1, started_at = COALESCE(started_at, $3), updated_at = $3
WHERE id = $4 AND status = 'queued';
SELECT * FROM tasks WHERE id = $4;

-- name: task_claim_workflow
SELECT id FROM tasks WHERE workflow_id = $4 AND status = 'queued' AND (not_before IS NULL OR not_before <= $3)
ORDER BY priority DESC, created_at, id LIMIT 1 FOR UPDATE SKIP LOCKED;
UPDATE tasks
SET status = 'running', lease_owner = $1, lease_expires_at = $2, lease_epoch = lease_epoch + 1,
    version = version + 1, started_at = COALESCE(started_at, $3), updated_at = $3
WHERE id = $5 AND status = 'queued';
SELECT * FROM tasks WHERE id = $5;

-- name: task_heartbeat
UPDATE tasks SET lease_expires_at = $1, updated_at = $2
WHERE id = $3 AND status = 'running' AND lease_owner = $4 AND lease_epoch = $5
  AND lease_expires_at > $2;  -- an expired lease is not extended, reaped or not
SELECT * FROM tasks WHERE id = $3;

-- name: task_expire_leases
-- Each expired lease, locked (its id becomes $3), moved, and read back.
SELECT id FROM tasks WHERE status = 'running' AND lease_expires_at IS NOT NULL AND lease_expires_at <= $2
ORDER BY created_at, id FOR UPDATE;
UPDATE tasks SET status = 'interrupted', lease_expires_at = NULL, version = version + 1, updated_at = $1
WHERE id = $3 AND status = 'running';
SELECT * FROM tasks WHERE id = $3;

-- name: task_expired_leases
-- What task_expire_leases would move, read through tasks_claim (status first).
SELECT * FROM tasks
WHERE status = 'running' AND lease_expires_at IS NOT NULL AND lease_expires_at <= $1
ORDER BY created_at, id;

-- name: workflow_exists
SELECT 1 AS found FROM workflows WHERE id = $1;

-- name: task_fence
SELECT status, lease_owner, lease_epoch,
       (lease_expires_at IS NULL OR lease_expires_at > $2) AS lease_live
FROM tasks WHERE id = $1 LOCK IN SHARE MODE;

-- name: step_get
SELECT * FROM task_steps WHERE task_id = $1 AND step_key = $2;

-- name: step_insert
-- on duplicate PRIMARY
INSERT INTO task_steps (task_id, step_key, status, attempt, started_at, first_started_at, attempt_id)
VALUES ($1, $2, 'started', 1, $3, $3, $4)
RETURNING *;

-- name: step_restart
UPDATE task_steps
SET status = 'started', attempt = attempt + 1, started_at = $1, finished_at = NULL, result = NULL,
    error = NULL, attempt_id = $6
WHERE task_id = $2 AND step_key = $3 AND status = $4 AND attempt = $5;
SELECT * FROM task_steps WHERE task_id = $2 AND step_key = $3;

-- name: step_finish
UPDATE task_steps SET status = $1, result = $2, error = $3, finished_at = $4
WHERE task_id = $5 AND step_key = $6 AND status = 'started' AND ($7 IS NULL OR attempt = $7);
SELECT * FROM task_steps WHERE task_id = $5 AND step_key = $6;

-- name: step_list
SELECT * FROM task_steps WHERE task_id = $1 ORDER BY first_started_at, step_key;

-- name: step_in_doubt
SELECT s.* FROM task_steps s JOIN tasks t ON t.id = s.task_id
WHERE s.status = 'started'
  AND NOT (t.status = 'running' AND (t.lease_expires_at IS NULL OR t.lease_expires_at > $1))
ORDER BY s.started_at, s.task_id, s.step_key;
