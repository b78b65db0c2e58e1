-- Tamper evidence beyond the chain, and what statekeel noticed about its own storage.

-- The HMAC of each entry's hash under the store's audit key (NULL for an entry appended without one).
ALTER TABLE audit_log ADD COLUMN mac TEXT;

-- The latest audit entry of an approval, found by its id: every approval change stores the digest of the
-- approval row in its entry, checked before the approval is honoured.
CREATE INDEX audit_by_approval ON audit_log (((data::jsonb) ->> 'approval_id'), seq)
WHERE kind LIKE 'approval.%';

-- Damage statekeel found when it opened the store: kept, and reported by recover() and info(), until
-- someone acknowledges it. (On PostgreSQL nothing records one yet; the table keeps both dialects alike.)
CREATE TABLE store_incidents (
    id              BIGSERIAL PRIMARY KEY,
    kind            TEXT NOT NULL,
    detected_at     TIMESTAMPTZ NOT NULL,
    detail          TEXT NOT NULL,
    acknowledged_at TIMESTAMPTZ,
    acknowledged_by TEXT
);
CREATE INDEX store_incidents_open ON store_incidents (id) WHERE acknowledged_at IS NULL;
