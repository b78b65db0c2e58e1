-- Schedules (store.schedules): a cron expression in a timezone, or an interval, and the template of the
-- task each slot creates. fired_through: every slot at or before it was handled (fired or skipped);
-- a tick advances it with a conditional update in the transaction that inserts the slot's task, whose
-- idempotency key names the schedule and the slot. next_fire_at (the first slot after it) is what the
-- tick's index reads.
CREATE TABLE schedules (
    id              TEXT COLLATE "C" PRIMARY KEY,
    name            TEXT COLLATE "C" NOT NULL UNIQUE,
    cron            TEXT,
    every_seconds   BIGINT CHECK (every_seconds IS NULL OR every_seconds >= 1),
    timezone        TEXT NOT NULL,
    task            JSONB NOT NULL,
    catch_up        TEXT NOT NULL CHECK (catch_up IN ('skip', 'one', 'all')),
    catch_up_window DOUBLE PRECISION NOT NULL CHECK (catch_up_window >= 0),
    overlap         TEXT NOT NULL CHECK (overlap IN ('skip', 'queue')),
    paused          BOOLEAN NOT NULL DEFAULT FALSE,
    fired_through   TIMESTAMPTZ NOT NULL,
    next_fire_at    TIMESTAMPTZ,
    last_slot       TIMESTAMPTZ,
    last_task_id    TEXT COLLATE "C",
    version         BIGINT NOT NULL DEFAULT 1,
    created_at      TIMESTAMPTZ NOT NULL,
    updated_at      TIMESTAMPTZ NOT NULL,
    CHECK ((cron IS NULL) <> (every_seconds IS NULL))
);
CREATE INDEX schedules_due ON schedules (paused, next_fire_at, id);
