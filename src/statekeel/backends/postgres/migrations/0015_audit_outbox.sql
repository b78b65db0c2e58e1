-- The audit outbox of a store paired with NATS (nats://…?rest=…), whose audit chain is on NATS: the audit
-- entries of the SQL kinds' changes (task transitions, approvals) are written here in the change's own
-- transaction, then relayed in order to the chain on NATS and deleted. Empty on every other store.
CREATE TABLE audit_outbox (
    id         BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    kind       TEXT NOT NULL,
    actor      TEXT NOT NULL,
    subject    TEXT NOT NULL,
    data       TEXT NOT NULL,
    created_at TIMESTAMPTZ NOT NULL
);

-- The stream sequence each relay attempt of an entry was published to land at, written (and committed)
-- before the publish: after a crash, the message at each of them tells whether the entry landed.
CREATE TABLE audit_outbox_attempts (
    outbox_id BIGINT NOT NULL,
    seq       BIGINT NOT NULL,
    PRIMARY KEY (outbox_id, seq)
);
