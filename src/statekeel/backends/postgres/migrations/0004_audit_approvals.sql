-- The hash-chained audit log (append-only, enforced by triggers) and approvals bound to exact arguments.

-- data is TEXT, not JSONB: the hash covers the canonical JSON text, and JSONB would normalize it (numbers,
-- key order), so the chain could not be re-verified byte for byte.
CREATE TABLE audit_log (
    seq        BIGINT PRIMARY KEY CHECK (seq >= 1),
    kind       TEXT NOT NULL,
    actor      TEXT NOT NULL,
    subject    TEXT COLLATE "C" NOT NULL,
    data       TEXT NOT NULL,
    created_at TIMESTAMPTZ NOT NULL,
    prev_hash  TEXT NOT NULL,
    hash       TEXT NOT NULL
);
CREATE INDEX audit_by_subject ON audit_log (subject, seq);
CREATE INDEX audit_by_kind ON audit_log (kind, seq);
CREATE INDEX audit_by_created ON audit_log (created_at, seq);

CREATE FUNCTION statekeel_refuse_change() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'statekeel: % is append-only, % refused', TG_TABLE_NAME, TG_OP
        USING ERRCODE = 'restrict_violation';
END
$$;

CREATE TRIGGER audit_log_no_change BEFORE UPDATE OR DELETE ON audit_log
    FOR EACH ROW EXECUTE FUNCTION statekeel_refuse_change();
CREATE TRIGGER audit_log_no_truncate BEFORE TRUNCATE ON audit_log
    FOR EACH STATEMENT EXECUTE FUNCTION statekeel_refuse_change();

CREATE TABLE approvals (
    id           TEXT COLLATE "C" PRIMARY KEY,
    subject      TEXT COLLATE "C" NOT NULL,
    action       TEXT NOT NULL,
    args         JSONB NOT NULL,
    args_hash    TEXT NOT NULL,
    status       TEXT NOT NULL DEFAULT 'pending' CHECK (status IN ('pending', 'granted', 'denied')),
    requested_by TEXT NOT NULL,
    requested_at TIMESTAMPTZ NOT NULL,
    expires_at   TIMESTAMPTZ,
    decided_by   TEXT,
    decided_at   TIMESTAMPTZ,
    reason       TEXT,
    consumed_by  TEXT,
    consumed_at  TIMESTAMPTZ,
    version      BIGINT NOT NULL DEFAULT 1
);
CREATE INDEX approvals_binding ON approvals (subject, action, args_hash, status);
CREATE INDEX approvals_pending ON approvals (requested_at, id) WHERE status = 'pending';

-- Approvals are evidence too: never deleted, decided once, consumed once.
CREATE TRIGGER approvals_no_delete BEFORE DELETE ON approvals
    FOR EACH ROW EXECUTE FUNCTION statekeel_refuse_change();
CREATE TRIGGER approvals_no_truncate BEFORE TRUNCATE ON approvals
    FOR EACH STATEMENT EXECUTE FUNCTION statekeel_refuse_change();

CREATE FUNCTION statekeel_approval_settled() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF OLD.consumed_at IS NOT NULL OR (OLD.status <> 'pending' AND NEW.status <> OLD.status) THEN
        RAISE EXCEPTION 'statekeel: a decided approval cannot be re-decided, a consumed one not reused'
            USING ERRCODE = 'restrict_violation';
    END IF;
    -- What was approved never changes: a grant cannot be re-pointed at other arguments, subject, action
    -- or expiry; a decision is not rewritten; only a granted approval is consumed.
    IF (NEW.id, NEW.subject, NEW.action, NEW.args, NEW.args_hash, NEW.requested_by, NEW.requested_at,
        NEW.expires_at)
       IS DISTINCT FROM (OLD.id, OLD.subject, OLD.action, OLD.args, OLD.args_hash, OLD.requested_by,
                         OLD.requested_at, OLD.expires_at)
       OR (OLD.status <> 'pending'
           AND (NEW.decided_by, NEW.decided_at, NEW.reason)
               IS DISTINCT FROM (OLD.decided_by, OLD.decided_at, OLD.reason))
       OR (NEW.consumed_at IS NOT NULL AND NEW.status <> 'granted') THEN
        RAISE EXCEPTION 'statekeel: an approval''s binding and decision cannot be changed'
            USING ERRCODE = 'restrict_violation';
    END IF;
    RETURN NEW;
END
$$;
CREATE TRIGGER approvals_settled BEFORE UPDATE ON approvals
    FOR EACH ROW EXECUTE FUNCTION statekeel_approval_settled();
