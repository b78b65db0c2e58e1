-- Workflows and their steps. Parameters ($1, $2 …) are in the same order as the other dialects' ($1 / ?1 …).

-- name: workflow_insert
INSERT INTO workflows (id, name, metadata, created_at, updated_at) VALUES ($1, $2, $3, $4, $4)
RETURNING *;

-- name: workflow_step_insert
INSERT INTO workflow_steps (workflow_id, name, position, task_id, depends_on) VALUES ($1, $2, $3, $4, $5);

-- name: workflow_get
SELECT * FROM workflows WHERE id = $1;

-- name: workflow_get_locked
-- The row lock serializes concurrent advancers of one workflow until the transaction ends.
SELECT * FROM workflows WHERE id = $1 FOR UPDATE;

-- name: workflow_steps
SELECT ws.name AS step_name, ws.depends_on AS step_depends_on, t.*
FROM workflow_steps ws JOIN tasks t ON t.id = ws.task_id
WHERE ws.workflow_id = $1 ORDER BY ws.position;

-- name: workflow_list
SELECT * FROM workflows ORDER BY created_at, id LIMIT $1;

-- name: workflow_list_status
SELECT * FROM workflows WHERE status = $1 ORDER BY created_at, id LIMIT $2;

-- name: workflow_update
UPDATE workflows
SET status = $1, started_at = $2, completed_at = $3, updated_at = $4, version = version + 1
WHERE id = $5 AND status = $6 AND version = $7;
SELECT * FROM workflows WHERE id = $5;
