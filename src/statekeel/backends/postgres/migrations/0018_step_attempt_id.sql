-- The attempt id of a step's started record: the caller's id for this start, so that a retry of a start
-- whose answer was lost recognises the record as its own (its function never ran) instead of a start
-- in doubt. NULL for records written before it.
ALTER TABLE task_steps ADD COLUMN attempt_id TEXT;
