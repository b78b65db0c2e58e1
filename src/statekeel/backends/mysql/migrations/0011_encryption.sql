-- Key rotation re-encrypts values in place (statekeel.encryption): an approval's arguments and a memory
-- event's state may be rewritten when nothing else of the row changes. What was approved stays fixed by
-- args_hash, which every check compares the (decrypted) arguments with; history keeps its events.

CREATE OR REPLACE TRIGGER approvals_settled BEFORE UPDATE ON approvals FOR EACH ROW
BEGIN
    -- Re-encryption: the arguments' stored form alone changes.
    IF NOT (NEW.id <=> OLD.id AND NEW.subject <=> OLD.subject AND NEW.action <=> OLD.action
            AND NEW.args_hash <=> OLD.args_hash AND NEW.status <=> OLD.status
            AND NEW.requested_by <=> OLD.requested_by AND NEW.requested_at <=> OLD.requested_at
            AND NEW.expires_at <=> OLD.expires_at AND NEW.decided_by <=> OLD.decided_by
            AND NEW.decided_at <=> OLD.decided_at AND NEW.reason <=> OLD.reason
            AND NEW.consumed_by <=> OLD.consumed_by AND NEW.consumed_at <=> OLD.consumed_at
            AND NEW.version <=> OLD.version) THEN
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
            SIGNAL SQLSTATE '45000'
                SET MESSAGE_TEXT = 'statekeel: an approval''s binding and decision cannot be changed';
        END IF;
    END IF;
END;

CREATE OR REPLACE TRIGGER memory_events_no_update BEFORE UPDATE ON memory_events FOR EACH ROW
BEGIN
    IF NOT (NEW.memory_id <=> OLD.memory_id AND NEW.version <=> OLD.version AND NEW.event <=> OLD.event
            AND NEW.actor <=> OLD.actor AND NEW.reason <=> OLD.reason AND NEW.at <=> OLD.at) THEN
        SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = 'statekeel: memory_events is append-only, UPDATE refused';
    END IF;
END;
