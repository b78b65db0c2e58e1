-- The audit chain. Parameters are numbered (?1, ?2 …) in the same order as PostgreSQL's.

-- name: audit_lock_head
-- SQLite has a single writer: appends are already serialized, and the head is read as it is.
SELECT seq, hash, mac FROM audit_log ORDER BY seq DESC LIMIT 1;

-- name: audit_insert
INSERT INTO audit_log (seq, kind, actor, subject, data, created_at, prev_hash, hash, mac)
VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9);

-- name: audit_read
SELECT * FROM audit_log
WHERE seq > ?1 AND (?2 IS NULL OR subject = ?2) AND (?3 IS NULL OR kind = ?3) AND (?4 IS NULL OR created_at >= ?4)
ORDER BY seq LIMIT ?5;

-- name: audit_latest_for_approval
-- Served by the partial index audit_by_approval (same expression and condition). Only the kinds statekeel
-- writes count, compared exactly (SQLite's LIKE ignores case): the same entries on every backend.
SELECT * FROM audit_log
WHERE kind LIKE 'approval.%'
  AND kind IN ('approval.requested', 'approval.granted', 'approval.denied', 'approval.consumed')
  AND json_extract(data, '$.approval_id') = ?1
ORDER BY seq DESC LIMIT 1;
