-- Schedules: each write is one statement whose WHERE carries its condition (the version read).
-- Parameters are numbered in the same order in every dialect.

-- name: schedule_insert
-- on duplicate schedules_name
INSERT INTO schedules (id, name, cron, every_seconds, timezone, task, catch_up, catch_up_window, overlap,
                       fired_through, next_fire_at, created_at, updated_at)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $12)
RETURNING *;

-- name: schedule_get
SELECT * FROM schedules WHERE name = $1;

-- name: schedule_get_by_id
SELECT * FROM schedules WHERE id = $1;

-- name: schedule_list
SELECT * FROM schedules WHERE name > $1 ORDER BY name LIMIT $2;

-- name: schedule_due
-- Read through schedules_due: the unpaused schedules whose next slot has come, in (next_fire_at, id) order.
SELECT * FROM schedules
WHERE paused = FALSE AND next_fire_at IS NOT NULL AND next_fire_at <= $1
  AND (next_fire_at, id) > ($2, $3)
ORDER BY next_fire_at, id LIMIT $4;

-- name: schedule_update
UPDATE schedules
SET cron = $1, every_seconds = $2, timezone = $3, task = $4, catch_up = $5, catch_up_window = $6,
    overlap = $7, paused = $8, fired_through = $9, next_fire_at = $10, updated_at = $11,
    version = version + 1
WHERE name = $12 AND version = $13;
SELECT * FROM schedules WHERE name = $12;

-- name: schedule_advance
-- The slot record: conditional on the version the tick planned from, so two ticks (or a tick and an edit)
-- never both advance it; it commits with the slots' tasks.
UPDATE schedules
SET fired_through = $1, next_fire_at = $2, updated_at = $3, version = version + 1
WHERE id = $4 AND version = $5;
SELECT * FROM schedules WHERE id = $4;

-- name: schedule_last_task
-- In the transaction of schedule_advance, which holds the row.
UPDATE schedules SET last_slot = $1, last_task_id = $2 WHERE id = $3;
SELECT * FROM schedules WHERE id = $3;

-- name: schedule_delete
-- The reason: the schedule the caller named is still the one it read (a schedule made again under that name
-- since is not deleted).
DELETE FROM schedules WHERE name = $1 AND id = $2;
