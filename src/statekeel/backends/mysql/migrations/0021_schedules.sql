-- Schedules (store.schedules): a cron expression in a timezone, or an interval, and the template of the
-- task each slot creates. fired_through: every slot at or before it was handled (fired or skipped);
-- a tick advances it with a conditional update in the transaction that inserts the slot's task, whose
-- idempotency key names the schedule and the slot. next_fire_at (the first slot after it) is what the
-- tick's index reads.
CREATE TABLE IF NOT EXISTS schedules (
    id              VARCHAR(64) NOT NULL PRIMARY KEY,
    name            VARCHAR(512) NOT NULL,
    cron            VARCHAR(1024),
    every_seconds   BIGINT CHECK (every_seconds IS NULL OR every_seconds >= 1),
    timezone        VARCHAR(128) NOT NULL,
    task            LONGTEXT NOT NULL,
    catch_up        VARCHAR(16) NOT NULL CHECK (catch_up IN ('skip', 'one', 'all')),
    catch_up_window DOUBLE NOT NULL CHECK (catch_up_window >= 0),
    overlap         VARCHAR(16) NOT NULL CHECK (overlap IN ('skip', 'queue')),
    paused          BOOLEAN NOT NULL DEFAULT FALSE,
    fired_through   DATETIME(6) NOT NULL,
    next_fire_at    DATETIME(6),
    last_slot       DATETIME(6),
    last_task_id    VARCHAR(512),
    version         BIGINT NOT NULL DEFAULT 1,
    created_at      DATETIME(6) NOT NULL,
    updated_at      DATETIME(6) NOT NULL,
    UNIQUE KEY schedules_name (name),
    CHECK ((cron IS NULL) <> (every_seconds IS NULL))
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;
CREATE INDEX IF NOT EXISTS schedules_due ON schedules (paused, next_fire_at, id);
