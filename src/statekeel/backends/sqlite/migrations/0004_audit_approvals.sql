-- The hash-chained audit log (append-only, enforced by triggers) and approvals bound to exact arguments.

-- data is the canonical JSON text the hash covers, kept byte for byte so the chain re-verifies.
CREATE TABLE audit_log (
    seq        INTEGER PRIMARY KEY NOT NULL CHECK (seq >= 1),
    kind       TEXT NOT NULL,
    actor      TEXT NOT NULL,
    subject    TEXT NOT NULL,
    data       TEXT NOT NULL,
    created_at INTEGER NOT NULL,
    prev_hash  TEXT NOT NULL,
    hash       TEXT NOT NULL
);
CREATE INDEX audit_by_subject ON audit_log (subject, seq);
CREATE INDEX audit_by_kind ON audit_log (kind, seq);
CREATE INDEX audit_by_created ON audit_log (created_at, seq);

CREATE TRIGGER audit_log_no_update BEFORE UPDATE ON audit_log
BEGIN
    SELECT RAISE(ABORT, 'statekeel: audit_log is append-only, UPDATE refused');
END;

CREATE TRIGGER audit_log_no_delete BEFORE DELETE ON audit_log
BEGIN
    SELECT RAISE(ABORT, 'statekeel: audit_log is append-only, DELETE refused');
END;

CREATE TABLE approvals (
    id           TEXT PRIMARY KEY NOT NULL,
    subject      TEXT NOT NULL,
    action       TEXT NOT NULL,
    args         TEXT NOT NULL,
    args_hash    TEXT NOT NULL,
    status       TEXT NOT NULL DEFAULT 'pending' CHECK (status IN ('pending', 'granted', 'denied')),
    requested_by TEXT NOT NULL,
    requested_at INTEGER NOT NULL,
    expires_at   INTEGER,
    decided_by   TEXT,
    decided_at   INTEGER,
    reason       TEXT,
    consumed_by  TEXT,
    consumed_at  INTEGER,
    version      INTEGER NOT NULL DEFAULT 1
);
CREATE INDEX approvals_binding ON approvals (subject, action, args_hash, status);
CREATE INDEX approvals_pending ON approvals (requested_at, id) WHERE status = 'pending';

-- Approvals are evidence too: never deleted, decided once, consumed once.
CREATE TRIGGER approvals_no_delete BEFORE DELETE ON approvals
BEGIN
    SELECT RAISE(ABORT, 'statekeel: approvals are never deleted');
END;

CREATE TRIGGER approvals_settled BEFORE UPDATE ON approvals
WHEN OLD.consumed_at IS NOT NULL OR (OLD.status <> 'pending' AND NEW.status <> OLD.status)
BEGIN
    SELECT RAISE(ABORT, 'statekeel: a decided approval cannot be re-decided, a consumed one not reused');
END;

-- What was approved never changes: a grant cannot be re-pointed at other arguments, subject, action or
-- expiry; a decision is not rewritten; only a granted approval is consumed.
CREATE TRIGGER approvals_binding_fixed BEFORE UPDATE ON approvals
WHEN NEW.id IS NOT OLD.id OR NEW.subject IS NOT OLD.subject OR NEW.action IS NOT OLD.action
    OR NEW.args IS NOT OLD.args OR NEW.args_hash IS NOT OLD.args_hash
    OR NEW.requested_by IS NOT OLD.requested_by OR NEW.requested_at IS NOT OLD.requested_at
    OR NEW.expires_at IS NOT OLD.expires_at
    OR (OLD.status <> 'pending' AND (NEW.decided_by IS NOT OLD.decided_by
        OR NEW.decided_at IS NOT OLD.decided_at OR NEW.reason IS NOT OLD.reason))
    OR (NEW.consumed_at IS NOT NULL AND NEW.status <> 'granted')
BEGIN
    SELECT RAISE(ABORT, 'statekeel: an approval''s binding and decision cannot be changed');
END;
