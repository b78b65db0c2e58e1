-- The audit outbox of a store paired with NATS (nats://…?rest=…), whose audit chain is on NATS: the audit
-- entries of the SQL kinds' changes (task transitions, approvals) are written here in the change's own
-- transaction, then relayed in order to the chain on NATS and deleted. Empty on every other store.
CREATE TABLE IF NOT EXISTS audit_outbox (
    id         BIGINT NOT NULL AUTO_INCREMENT PRIMARY KEY,
    kind       VARCHAR(512) NOT NULL,
    actor      VARCHAR(512) NOT NULL,
    subject    VARCHAR(512) NOT NULL,
    data       LONGTEXT NOT NULL,
    created_at DATETIME(6) NOT NULL
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;

-- The stream sequence each relay attempt of an entry was published to land at, written (and committed)
-- before the publish: after a crash, the message at each of them tells whether the entry landed.
CREATE TABLE IF NOT EXISTS audit_outbox_attempts (
    outbox_id BIGINT NOT NULL,
    seq       BIGINT NOT NULL,
    PRIMARY KEY (outbox_id, seq)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;
