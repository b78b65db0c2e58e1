-- The id of the transition that last changed a task: the caller's id for that transition(), so that a
-- retry of a transition whose answer was lost learns that its own change landed instead of being refused
-- as fenced out. NULL for rows written before it and after claims.
ALTER TABLE tasks ADD COLUMN transition_id TEXT;
