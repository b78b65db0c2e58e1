-- Which save last appended to a session (an id the saving SessionManager makes up per attempt; NULL for a
-- write that gives none): a save whose answer never reached its caller (cancelled, or its COMMIT's answer
-- lost) finds its own write here, rather than mistaking it for another writer's.

ALTER TABLE sessions ADD COLUMN IF NOT EXISTS write_id VARCHAR(255);
