-- The audit chain. Parameters ($1, $2 …) are in the same order as SQLite's ?1, ?2.

-- name: audit_lock_head
-- The chain's lock (held until the transaction ends, so two writers never fork the chain) and then its
-- head, read after the lock is held: one call of the function migration 0014 installs, which takes
-- pg_advisory_xact_lock(4182301976).
SELECT seq, hash, mac FROM statekeel_audit_lock_head();

-- name: audit_insert
INSERT INTO audit_log (seq, kind, actor, subject, data, created_at, prev_hash, hash, mac)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9);

-- name: audit_read
SELECT * FROM audit_log
WHERE seq > $1 AND ($2::text IS NULL OR subject = $2) AND ($3::text IS NULL OR kind = $3)
  AND ($4::timestamptz IS NULL OR created_at >= $4)
ORDER BY seq LIMIT $5;

-- name: audit_latest_for_approval
-- Served by the partial index audit_by_approval (same expression and condition). Only the kinds statekeel
-- writes count, compared exactly (SQLite's LIKE ignores case): the same entries on every backend.
SELECT * FROM audit_log
WHERE kind LIKE 'approval.%'
  AND kind IN ('approval.requested', 'approval.granted', 'approval.denied', 'approval.consumed')
  AND ((data::jsonb) ->> 'approval_id') = $1
ORDER BY seq DESC LIMIT 1;
