-- The audit chain's lock and head in one call. An append takes the chain's transaction-scoped advisory
-- lock and then reads the head: as two statements that is two round trips. In this function the head is
-- read after the lock is held, on a snapshot taken then (each statement of a volatile function takes its
-- own at read committed), so it sees the entry of the writer that held the lock before.
CREATE FUNCTION statekeel_audit_lock_head() RETURNS TABLE (seq BIGINT, hash TEXT, mac TEXT)
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    PERFORM pg_advisory_xact_lock(4182301976);
    RETURN QUERY SELECT a.seq, a.hash, a.mac FROM audit_log a ORDER BY a.seq DESC LIMIT 1;
END
$$;
