-- Approvals. Parameters ($1, $2 …) are in the same order as the other dialects' ($1 / ?1 …).

-- name: approval_insert
INSERT INTO approvals (id, subject, action, args, args_hash, requested_by, requested_at, expires_at)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8)
RETURNING *;

-- name: approval_get
SELECT * FROM approvals WHERE id = $1;

-- name: approval_decide
UPDATE approvals SET status = $1, decided_by = $2, decided_at = $3, reason = $4, version = version + 1
WHERE id = $5 AND status = 'pending' AND (expires_at IS NULL OR expires_at > $3);
SELECT * FROM approvals WHERE id = $5;

-- name: approval_find
SELECT * FROM approvals
WHERE subject = $1 AND action = $2 AND args_hash = $3 AND status = 'granted' AND consumed_at IS NULL
  AND (expires_at IS NULL OR expires_at > $4)
ORDER BY requested_at, id LIMIT 1;

-- name: approval_consume
UPDATE approvals SET consumed_by = $1, consumed_at = $2, version = version + 1
WHERE id = $3 AND status = 'granted' AND consumed_at IS NULL AND (expires_at IS NULL OR expires_at > $2);
SELECT * FROM approvals WHERE id = $3;

-- name: approval_pending
SELECT * FROM approvals WHERE status = 'pending' AND (expires_at IS NULL OR expires_at > $1)
ORDER BY requested_at, id LIMIT $2;

-- name: approval_list
SELECT * FROM approvals WHERE id > $1 ORDER BY id LIMIT $2;
