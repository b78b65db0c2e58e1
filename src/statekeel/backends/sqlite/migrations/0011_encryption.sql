-- Key rotation re-encrypts values in place (statekeel.encryption): an approval's arguments and a memory
-- event's state may be rewritten when nothing else of the row changes. What was approved stays fixed by
-- args_hash, which every check compares the (decrypted) arguments with; history keeps its events.
-- Each approval trigger is the one of 0004, except for an update that changes the arguments' stored form
-- alone (a re-encryption).

DROP TRIGGER approvals_settled;
CREATE TRIGGER approvals_settled BEFORE UPDATE ON approvals
WHEN (OLD.consumed_at IS NOT NULL OR (OLD.status <> 'pending' AND NEW.status <> OLD.status))
    AND NOT (NEW.id IS OLD.id AND NEW.subject IS OLD.subject AND NEW.action IS OLD.action
        AND NEW.args_hash IS OLD.args_hash AND NEW.status IS OLD.status
        AND NEW.requested_by IS OLD.requested_by AND NEW.requested_at IS OLD.requested_at
        AND NEW.expires_at IS OLD.expires_at AND NEW.decided_by IS OLD.decided_by
        AND NEW.decided_at IS OLD.decided_at AND NEW.reason IS OLD.reason
        AND NEW.consumed_by IS OLD.consumed_by AND NEW.consumed_at IS OLD.consumed_at
        AND NEW.version IS OLD.version)
BEGIN
    SELECT RAISE(ABORT, 'statekeel: a decided approval cannot be re-decided, a consumed one not reused');
END;

DROP TRIGGER approvals_binding_fixed;
CREATE TRIGGER approvals_binding_fixed BEFORE UPDATE ON approvals
WHEN (NEW.id IS NOT OLD.id OR NEW.subject IS NOT OLD.subject OR NEW.action IS NOT OLD.action
    OR NEW.args IS NOT OLD.args OR NEW.args_hash IS NOT OLD.args_hash
    OR NEW.requested_by IS NOT OLD.requested_by OR NEW.requested_at IS NOT OLD.requested_at
    OR NEW.expires_at IS NOT OLD.expires_at
    OR (OLD.status <> 'pending' AND (NEW.decided_by IS NOT OLD.decided_by
        OR NEW.decided_at IS NOT OLD.decided_at OR NEW.reason IS NOT OLD.reason))
    OR (NEW.consumed_at IS NOT NULL AND NEW.status <> 'granted'))
    AND NOT (NEW.id IS OLD.id AND NEW.subject IS OLD.subject AND NEW.action IS OLD.action
        AND NEW.args_hash IS OLD.args_hash AND NEW.status IS OLD.status
        AND NEW.requested_by IS OLD.requested_by AND NEW.requested_at IS OLD.requested_at
        AND NEW.expires_at IS OLD.expires_at AND NEW.decided_by IS OLD.decided_by
        AND NEW.decided_at IS OLD.decided_at AND NEW.reason IS OLD.reason
        AND NEW.consumed_by IS OLD.consumed_by AND NEW.consumed_at IS OLD.consumed_at
        AND NEW.version IS OLD.version)
BEGIN
    SELECT RAISE(ABORT, 'statekeel: an approval''s binding and decision cannot be changed');
END;

DROP TRIGGER memory_events_no_update;
CREATE TRIGGER memory_events_no_update BEFORE UPDATE ON memory_events
WHEN NEW.memory_id IS NOT OLD.memory_id OR NEW.version IS NOT OLD.version OR NEW.event IS NOT OLD.event
    OR NEW.actor IS NOT OLD.actor OR NEW.reason IS NOT OLD.reason OR NEW.at IS NOT OLD.at
BEGIN
    SELECT RAISE(ABORT, 'statekeel: memory history is append-only, UPDATE refused');
END;
