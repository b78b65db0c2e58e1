-- Delayed tasks: the earliest time a claim may take a queued task (NULL: at once), set by tasks.create(...,
-- not_before=) or by a transition back to queued (a retry with backoff). The claim index carries it, so
-- the claim skips tasks not yet due without reading their rows.
ALTER TABLE tasks ADD COLUMN IF NOT EXISTS not_before DATETIME(6) NULL;
DROP INDEX IF EXISTS tasks_claim ON tasks;
CREATE INDEX IF NOT EXISTS tasks_claim ON tasks (status, priority DESC, created_at, id, not_before);
