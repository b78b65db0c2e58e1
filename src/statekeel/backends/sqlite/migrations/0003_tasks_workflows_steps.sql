-- Workflows (DAGs of tasks), tasks with leases, and each task's step journal.
-- Timestamps are integer microseconds since the Unix epoch, UTC; JSON columns are TEXT.

CREATE TABLE workflows (
    id           TEXT PRIMARY KEY NOT NULL,
    name         TEXT NOT NULL,
    status       TEXT NOT NULL DEFAULT 'pending'
                 CHECK (status IN ('pending', 'running', 'success', 'failed', 'cancelled')),
    metadata     TEXT NOT NULL DEFAULT '{}',
    version      INTEGER NOT NULL DEFAULT 1,
    created_at   INTEGER NOT NULL,
    updated_at   INTEGER NOT NULL,
    started_at   INTEGER,
    completed_at INTEGER
);
CREATE INDEX workflows_by_status ON workflows (status, created_at, id);
CREATE INDEX workflows_by_created ON workflows (created_at, id);

CREATE TABLE tasks (
    id               TEXT PRIMARY KEY NOT NULL,
    workflow_id      TEXT REFERENCES workflows (id) ON DELETE CASCADE,
    parent_task_id   TEXT REFERENCES tasks (id) ON DELETE SET NULL,
    title            TEXT NOT NULL,
    description      TEXT,
    status           TEXT NOT NULL CHECK (status IN ('pending', 'queued', 'running', 'suspended',
                                                     'interrupted', 'success', 'failed', 'cancelled')),
    priority         INTEGER NOT NULL DEFAULT 5,
    result           TEXT,
    error            TEXT,
    retry_count      INTEGER NOT NULL DEFAULT 0 CHECK (retry_count >= 0),
    max_retries      INTEGER NOT NULL DEFAULT 3 CHECK (max_retries >= 0),
    metadata         TEXT NOT NULL DEFAULT '{}',
    version          INTEGER NOT NULL DEFAULT 1,
    lease_owner      TEXT,
    lease_expires_at INTEGER,
    lease_epoch      INTEGER NOT NULL DEFAULT 0,
    idempotency_key  TEXT UNIQUE,
    created_at       INTEGER NOT NULL,
    updated_at       INTEGER NOT NULL,
    started_at       INTEGER,
    completed_at     INTEGER
);
-- claim reads the first row of this index among queued tasks: highest priority, then oldest.
CREATE INDEX tasks_claim ON tasks (status, priority DESC, created_at, id);
CREATE INDEX tasks_by_workflow ON tasks (workflow_id, status, priority DESC, created_at, id);
CREATE INDEX tasks_by_created ON tasks (created_at, id);
CREATE INDEX tasks_by_parent ON tasks (parent_task_id) WHERE parent_task_id IS NOT NULL;
CREATE INDEX tasks_leased ON tasks (lease_expires_at) WHERE status = 'running';

CREATE TABLE workflow_steps (
    workflow_id TEXT NOT NULL REFERENCES workflows (id) ON DELETE CASCADE,
    name        TEXT NOT NULL,
    position    INTEGER NOT NULL,
    task_id     TEXT NOT NULL UNIQUE REFERENCES tasks (id) ON DELETE CASCADE,
    depends_on  TEXT NOT NULL DEFAULT '[]',
    PRIMARY KEY (workflow_id, name)
);

-- Two-phase: a row is committed as 'started' before the step's function runs, settled after.
CREATE TABLE task_steps (
    task_id     TEXT NOT NULL REFERENCES tasks (id) ON DELETE CASCADE,
    step_key    TEXT NOT NULL,
    status      TEXT NOT NULL CHECK (status IN ('started', 'succeeded', 'failed')),
    attempt     INTEGER NOT NULL DEFAULT 1 CHECK (attempt >= 1),
    result      TEXT,
    error       TEXT,
    started_at  INTEGER NOT NULL,
    first_started_at INTEGER NOT NULL,
    finished_at INTEGER,
    PRIMARY KEY (task_id, step_key)
) WITHOUT ROWID;
CREATE INDEX task_steps_started ON task_steps (task_id) WHERE status = 'started';
