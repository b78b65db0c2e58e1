-- Key rotation re-encrypts values in place (statekeel.encryption): an approval's arguments and a memory
-- event's state may be rewritten when nothing else of the row changes. What was approved stays fixed by
-- args_hash, which every check compares the (decrypted) arguments with; history keeps its events.

CREATE OR REPLACE FUNCTION statekeel_approval_settled() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    -- Re-encryption: the arguments' stored form alone changes.
    IF (NEW.id, NEW.subject, NEW.action, NEW.args_hash, NEW.status, NEW.requested_by, NEW.requested_at,
        NEW.expires_at, NEW.decided_by, NEW.decided_at, NEW.reason, NEW.consumed_by, NEW.consumed_at,
        NEW.version)
       IS NOT DISTINCT FROM (OLD.id, OLD.subject, OLD.action, OLD.args_hash, OLD.status, OLD.requested_by,
                             OLD.requested_at, OLD.expires_at, OLD.decided_by, OLD.decided_at, OLD.reason,
                             OLD.consumed_by, OLD.consumed_at, OLD.version) THEN
        RETURN NEW;
    END IF;
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

CREATE FUNCTION statekeel_memory_event_fixed() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF (NEW.memory_id, NEW.version, NEW.event, NEW.actor, NEW.reason, NEW.at)
       IS DISTINCT FROM (OLD.memory_id, OLD.version, OLD.event, OLD.actor, OLD.reason, OLD.at) THEN
        RAISE EXCEPTION 'statekeel: % is append-only, UPDATE refused', TG_TABLE_NAME
            USING ERRCODE = 'restrict_violation';
    END IF;
    RETURN NEW;
END
$$;

DROP TRIGGER memory_events_no_update ON memory_events;
CREATE TRIGGER memory_events_no_update BEFORE UPDATE ON memory_events
    FOR EACH ROW EXECUTE FUNCTION statekeel_memory_event_fixed();
