-- The audit chain. Parameters ($1, $2 …) are in the same order as the other dialects' ($1 / ?1 …).

-- name: audit_lock_head
-- Serializes appends until the transaction ends, so two writers never fork the chain: the row lock of
-- statekeel_locks' 'audit' row (a transaction lock InnoDB's deadlock detection sees); then the head, read
-- after the lock is held.
SELECT 1 AS locked FROM statekeel_locks WHERE name = 'audit' FOR UPDATE;
SELECT seq, hash, mac FROM audit_log ORDER BY seq DESC LIMIT 1;

-- name: audit_insert
INSERT INTO audit_log (seq, kind, actor, subject, data, created_at, prev_hash, hash, mac)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9);

-- name: audit_read
SELECT * FROM audit_log
WHERE seq > $1 AND ($2 IS NULL OR subject = $2) AND ($3 IS NULL OR kind = $3)
  AND ($4 IS NULL OR created_at >= $4)
ORDER BY seq LIMIT $5;

-- name: audit_latest_for_approval
-- Served by the index audit_by_approval on the generated column approval_id (set for approval.* kinds).
-- Only the kinds statekeel writes count, compared exactly: the same entries on every backend.
SELECT * FROM audit_log
WHERE approval_id = $1
  AND kind IN ('approval.requested', 'approval.granted', 'approval.denied', 'approval.consumed')
ORDER BY seq DESC LIMIT 1;


-- The outbox of a store paired with NATS (migration 0015): entries waiting to be relayed to the chain there.

-- name: audit_outbox_insert
INSERT INTO audit_outbox (kind, actor, subject, data, created_at) VALUES ($1, $2, $3, $4, $5);

-- name: audit_outbox_pending
SELECT id, kind, actor, subject, data, created_at FROM audit_outbox WHERE id > $1 ORDER BY id LIMIT $2;

-- name: audit_outbox_attempt
-- Committed before the publish it names: the sequence the entry was sent to land at.
INSERT IGNORE INTO audit_outbox_attempts (outbox_id, seq) VALUES ($1, $2);

-- name: audit_outbox_waiting
-- The entry is still waiting: its id and time (an id may name another entry once this one was relayed).
SELECT count(*) AS n FROM audit_outbox WHERE id = $1 AND created_at = $2;

-- name: audit_outbox_attempts
SELECT seq FROM audit_outbox_attempts WHERE outbox_id = $1 ORDER BY seq;

-- name: audit_outbox_relayed
-- Only the entry whose relay was seen on the chain is deleted: its id and time, as the relay read them.
DELETE FROM audit_outbox WHERE id = $1 AND created_at = $2;

-- name: audit_outbox_attempts_relayed
DELETE FROM audit_outbox_attempts WHERE outbox_id = $1;

-- name: audit_outbox_lag
SELECT count(*) AS n, min(created_at) AS oldest FROM audit_outbox;
