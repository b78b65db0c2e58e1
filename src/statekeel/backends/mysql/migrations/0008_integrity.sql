-- Tamper evidence beyond the chain, and what statekeel noticed about its own storage.

-- The HMAC of each entry's hash under the store's audit key (NULL for an entry appended without one).
ALTER TABLE audit_log ADD COLUMN IF NOT EXISTS mac VARCHAR(128);

-- The latest audit entry of an approval, found by its id: every approval change stores the digest of the
-- approval row in its entry, checked before the approval is honoured. A generated column takes the place
-- of PostgreSQL's partial expression index.
ALTER TABLE audit_log ADD COLUMN IF NOT EXISTS approval_id VARCHAR(512)
    AS (IF(kind LIKE 'approval.%', JSON_VALUE(data, '$.approval_id'), NULL)) PERSISTENT;
CREATE INDEX IF NOT EXISTS audit_by_approval ON audit_log (approval_id, seq);

-- Damage statekeel found when it opened the store: kept, and reported by recover() and info(), until
-- someone acknowledges it. (On this dialect nothing records one yet; the table keeps the dialects alike.)
CREATE TABLE IF NOT EXISTS store_incidents (
    id              BIGINT NOT NULL AUTO_INCREMENT PRIMARY KEY,
    kind            VARCHAR(64) NOT NULL,
    detected_at     DATETIME(6) NOT NULL,
    detail          LONGTEXT NOT NULL,
    acknowledged_at DATETIME(6),
    acknowledged_by VARCHAR(512)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;
CREATE INDEX IF NOT EXISTS store_incidents_open ON store_incidents (acknowledged_at, id);
