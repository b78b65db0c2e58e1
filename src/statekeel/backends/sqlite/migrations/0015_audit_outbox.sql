-- The audit outbox of a store paired with NATS (nats://…?rest=…), whose audit chain is on NATS: the audit
-- entries of the SQL kinds' changes (task transitions, approvals) are written here in the change's own
-- transaction, then relayed in order to the chain on NATS and deleted. Empty on every other store. (An id
-- may be used again once its entry was relayed: an entry on the chain is named by its content, not its id.)
CREATE TABLE audit_outbox (
    id         INTEGER PRIMARY KEY,
    kind       TEXT NOT NULL,
    actor      TEXT NOT NULL,
    subject    TEXT NOT NULL,
    data       TEXT NOT NULL,
    created_at INTEGER NOT NULL
);

-- The stream sequence each relay attempt of an entry was published to land at, written (and committed)
-- before the publish: after a crash, the message at each of them tells whether the entry landed.
CREATE TABLE audit_outbox_attempts (
    outbox_id INTEGER NOT NULL,
    seq       INTEGER NOT NULL,
    PRIMARY KEY (outbox_id, seq)
);
