-- Schedules (store.schedules): a cron expression in a timezone, or an interval, and the template of the
-- task each slot creates. fired_through: every slot at or before it was handled (fired or skipped);
-- a tick advances it with a conditional update in the transaction that inserts the slot's task, whose
-- idempotency key names the schedule and the slot. next_fire_at (the first slot after it) is what the
-- tick's index reads.
CREATE TABLE schedules (
    id              TEXT PRIMARY KEY NOT NULL,
    name            TEXT NOT NULL UNIQUE,
    cron            TEXT,
    every_seconds   INTEGER CHECK (every_seconds IS NULL OR every_seconds >= 1),
    timezone        TEXT NOT NULL,
    task            TEXT NOT NULL,
    catch_up        TEXT NOT NULL CHECK (catch_up IN ('skip', 'one', 'all')),
    catch_up_window REAL NOT NULL CHECK (catch_up_window >= 0),
    overlap         TEXT NOT NULL CHECK (overlap IN ('skip', 'queue')),
    paused          INTEGER NOT NULL DEFAULT 0 CHECK (paused IN (0, 1)),
    fired_through   INTEGER NOT NULL,
    next_fire_at    INTEGER,
    last_slot       INTEGER,
    last_task_id    TEXT,
    version         INTEGER NOT NULL DEFAULT 1,
    created_at      INTEGER NOT NULL,
    updated_at      INTEGER NOT NULL,
    CHECK ((cron IS NULL) <> (every_seconds IS NULL))
);
CREATE INDEX schedules_due ON schedules (paused, next_fire_at, id);
