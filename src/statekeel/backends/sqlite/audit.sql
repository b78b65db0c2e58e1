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

-- The outbox of a store paired with NATS (migration 0015): entries waiting to be relayed to the chain there.

-- name: audit_outbox_insert
INSERT INTO audit_outbox (kind, actor, subject, data, created_at) VALUES (?1, ?2, ?3, ?4, ?5);

-- name: audit_outbox_pending
SELECT id, kind, actor, subject, data, created_at FROM audit_outbox WHERE id > ?1 ORDER BY id LIMIT ?2;

-- name: audit_outbox_attempt
-- Committed before the publish it names: the sequence the entry was sent to land at.
INSERT OR IGNORE INTO audit_outbox_attempts (outbox_id, seq) VALUES (?1, ?2);

-- name: audit_outbox_waiting
-- The entry is still waiting: its id and time (an id may name another entry once this one was relayed).
SELECT count(*) AS n FROM audit_outbox WHERE id = ?1 AND created_at = ?2;

-- name: audit_outbox_attempts
SELECT seq FROM audit_outbox_attempts WHERE outbox_id = ?1 ORDER BY seq;

-- name: audit_outbox_relayed
-- Only the entry whose relay was seen on the chain is deleted: its id and time, as the relay read them.
DELETE FROM audit_outbox WHERE id = ?1 AND created_at = ?2;

-- name: audit_outbox_attempts_relayed
DELETE FROM audit_outbox_attempts WHERE outbox_id = ?1;

-- name: audit_outbox_lag
SELECT count(*) AS n, min(created_at) AS oldest FROM audit_outbox;
