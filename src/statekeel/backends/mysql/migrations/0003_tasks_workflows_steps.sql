-- Workflows (DAGs of tasks), tasks with leases, and each task's step journal. Secondary indexes end with
-- the primary key implicitly (InnoDB), which keeps them within the index length limit.

CREATE TABLE IF NOT EXISTS workflows (
    id           VARCHAR(512) NOT NULL PRIMARY KEY,
    name         LONGTEXT NOT NULL,
    status       VARCHAR(16) NOT NULL DEFAULT 'pending'
                 CHECK (status IN ('pending', 'running', 'success', 'failed', 'cancelled')),
    metadata     LONGTEXT NOT NULL DEFAULT '{}',
    version      BIGINT NOT NULL DEFAULT 1,
    created_at   DATETIME(6) NOT NULL,
    updated_at   DATETIME(6) NOT NULL,
    started_at   DATETIME(6),
    completed_at DATETIME(6)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;
CREATE INDEX IF NOT EXISTS workflows_by_status ON workflows (status, created_at, id);
CREATE INDEX IF NOT EXISTS workflows_by_created ON workflows (created_at, id);

CREATE TABLE IF NOT EXISTS tasks (
    id               VARCHAR(512) NOT NULL PRIMARY KEY,
    workflow_id      VARCHAR(512),
    parent_task_id   VARCHAR(512),
    title            LONGTEXT NOT NULL,
    description      LONGTEXT,
    status           VARCHAR(16) NOT NULL CHECK (status IN ('pending', 'queued', 'running', 'suspended',
                                                     'interrupted', 'success', 'failed', 'cancelled')),
    priority         INTEGER NOT NULL DEFAULT 5,
    result           LONGTEXT,
    error            LONGTEXT,
    retry_count      INTEGER NOT NULL DEFAULT 0 CHECK (retry_count >= 0),
    max_retries      INTEGER NOT NULL DEFAULT 3 CHECK (max_retries >= 0),
    metadata         LONGTEXT NOT NULL DEFAULT '{}',
    version          BIGINT NOT NULL DEFAULT 1,
    lease_owner      VARCHAR(512),
    lease_expires_at DATETIME(6),
    lease_epoch      BIGINT NOT NULL DEFAULT 0,
    idempotency_key  VARCHAR(512),
    created_at       DATETIME(6) NOT NULL,
    updated_at       DATETIME(6) NOT NULL,
    started_at       DATETIME(6),
    completed_at     DATETIME(6),
    UNIQUE KEY tasks_idempotency_key (idempotency_key),
    CONSTRAINT tasks_workflow FOREIGN KEY (workflow_id) REFERENCES workflows (id) ON DELETE CASCADE,
    CONSTRAINT tasks_parent FOREIGN KEY (parent_task_id) REFERENCES tasks (id) ON DELETE SET NULL
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;
-- claim reads the first row of this index among queued tasks: highest priority, then oldest.
CREATE INDEX IF NOT EXISTS tasks_claim ON tasks (status, priority DESC, created_at, id);
CREATE INDEX IF NOT EXISTS tasks_by_workflow ON tasks (workflow_id, status, priority DESC, created_at);
CREATE INDEX IF NOT EXISTS tasks_by_created ON tasks (created_at, id);
CREATE INDEX IF NOT EXISTS tasks_leased ON tasks (status, lease_expires_at);

CREATE TABLE IF NOT EXISTS workflow_steps (
    workflow_id VARCHAR(512) NOT NULL,
    name        VARCHAR(255) NOT NULL,
    position    INTEGER NOT NULL,
    task_id     VARCHAR(512) NOT NULL,
    depends_on  LONGTEXT NOT NULL DEFAULT '[]',
    PRIMARY KEY (workflow_id, name),
    UNIQUE KEY workflow_steps_task (task_id),
    CONSTRAINT workflow_steps_workflow FOREIGN KEY (workflow_id) REFERENCES workflows (id) ON DELETE CASCADE,
    CONSTRAINT workflow_steps_task FOREIGN KEY (task_id) REFERENCES tasks (id) ON DELETE CASCADE
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;

-- Two-phase: a row is committed as 'started' before the step's function runs, settled after.
CREATE TABLE IF NOT EXISTS task_steps (
    task_id     VARCHAR(512) NOT NULL,
    step_key    VARCHAR(255) NOT NULL,
    status      VARCHAR(16) NOT NULL CHECK (status IN ('started', 'succeeded', 'failed')),
    attempt     INTEGER NOT NULL DEFAULT 1 CHECK (attempt >= 1),
    result      LONGTEXT,
    error       LONGTEXT,
    started_at  DATETIME(6) NOT NULL,
    first_started_at DATETIME(6) NOT NULL,
    finished_at DATETIME(6),
    PRIMARY KEY (task_id, step_key),
    INDEX task_steps_started (status, task_id),
    CONSTRAINT task_steps_task FOREIGN KEY (task_id) REFERENCES tasks (id) ON DELETE CASCADE
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;
