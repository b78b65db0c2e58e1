-- The hash-chained audit log (append-only, enforced by triggers) and approvals bound to exact arguments.

-- data is LONGTEXT: the hash covers the canonical JSON text, kept byte for byte.
CREATE TABLE IF NOT EXISTS audit_log (
    seq        BIGINT NOT NULL PRIMARY KEY CHECK (seq >= 1),
    kind       VARCHAR(512) NOT NULL,
    actor      VARCHAR(512) NOT NULL,
    subject    VARCHAR(512) NOT NULL,
    data       LONGTEXT NOT NULL,
    created_at DATETIME(6) NOT NULL,
    prev_hash  VARCHAR(128) NOT NULL,
    hash       VARCHAR(128) NOT NULL
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;
CREATE INDEX IF NOT EXISTS audit_by_subject ON audit_log (subject, seq);
CREATE INDEX IF NOT EXISTS audit_by_kind ON audit_log (kind, seq);
CREATE INDEX IF NOT EXISTS audit_by_created ON audit_log (created_at, seq);

-- Appends to the chain are serialized by a row lock on this table's 'audit' row (released at COMMIT or
-- ROLLBACK, and seen by InnoDB's deadlock detection), where PostgreSQL takes a transaction advisory lock.
CREATE TABLE IF NOT EXISTS statekeel_locks (
    name VARCHAR(64) NOT NULL PRIMARY KEY
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;
INSERT IGNORE INTO statekeel_locks (name) VALUES ('audit');

CREATE OR REPLACE TRIGGER audit_log_no_update BEFORE UPDATE ON audit_log FOR EACH ROW
BEGIN
    SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = 'statekeel: audit_log is append-only, UPDATE refused';
END;

CREATE OR REPLACE TRIGGER audit_log_no_delete BEFORE DELETE ON audit_log FOR EACH ROW
BEGIN
    SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = 'statekeel: audit_log is append-only, DELETE refused';
END;

CREATE TABLE IF NOT EXISTS approvals (
    id           VARCHAR(512) NOT NULL PRIMARY KEY,
    subject      VARCHAR(512) NOT NULL,
    action       VARCHAR(512) NOT NULL,
    args         LONGTEXT NOT NULL,
    args_hash    VARCHAR(128) NOT NULL,
    status       VARCHAR(16) NOT NULL DEFAULT 'pending' CHECK (status IN ('pending', 'granted', 'denied')),
    requested_by VARCHAR(512) NOT NULL,
    requested_at DATETIME(6) NOT NULL,
    expires_at   DATETIME(6),
    decided_by   VARCHAR(512),
    decided_at   DATETIME(6),
    reason       LONGTEXT,
    consumed_by  VARCHAR(512),
    consumed_at  DATETIME(6),
    version      BIGINT NOT NULL DEFAULT 1
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;
CREATE INDEX IF NOT EXISTS approvals_binding ON approvals (subject(255), action(255), args_hash, status);
CREATE INDEX IF NOT EXISTS approvals_pending ON approvals (status, requested_at, id);

-- Approvals are evidence too: never deleted, decided once, consumed once.
CREATE OR REPLACE TRIGGER approvals_no_delete BEFORE DELETE ON approvals FOR EACH ROW
BEGIN
    SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = 'statekeel: approvals is append-only, DELETE refused';
END;

CREATE OR REPLACE TRIGGER approvals_settled BEFORE UPDATE ON approvals FOR EACH ROW
BEGIN
    IF OLD.consumed_at IS NOT NULL OR (OLD.status <> 'pending' AND NEW.status <> OLD.status) THEN
        SIGNAL SQLSTATE '45000'
            SET MESSAGE_TEXT = 'statekeel: a decided approval cannot be re-decided, a consumed one not reused';
    END IF;
    IF NOT (NEW.id <=> OLD.id AND NEW.subject <=> OLD.subject AND NEW.action <=> OLD.action
            AND NEW.args <=> OLD.args AND NEW.args_hash <=> OLD.args_hash
            AND NEW.requested_by <=> OLD.requested_by AND NEW.requested_at <=> OLD.requested_at
            AND NEW.expires_at <=> OLD.expires_at)
       OR (OLD.status <> 'pending'
           AND NOT (NEW.decided_by <=> OLD.decided_by AND NEW.decided_at <=> OLD.decided_at
                    AND NEW.reason <=> OLD.reason))
       OR (NEW.consumed_at IS NOT NULL AND NEW.status <> 'granted') THEN
        SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = 'statekeel: an approval''s binding and decision cannot be changed';
    END IF;
END;
