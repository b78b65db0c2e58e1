-- Graph checkpoints (LangGraph's saver): a checkpoint row per (thread, namespace, id), each channel's value
-- stored once per version, and the pending writes of the tasks that ran after a checkpoint. Values are the
-- framework serializer's bytes (type tag + LONGBLOB); metadata and channel_versions are JSON text. The
-- key columns are sized so that each primary key fits InnoDB's 3072-byte index limit.

CREATE TABLE IF NOT EXISTS checkpoints (
    thread_id            VARCHAR(255) NOT NULL,
    checkpoint_ns        VARCHAR(255) NOT NULL,
    checkpoint_id        VARCHAR(255) NOT NULL,
    parent_checkpoint_id VARCHAR(255),
    run_id               VARCHAR(255),
    type                 VARCHAR(64) NOT NULL,
    checkpoint           LONGBLOB NOT NULL,
    metadata             LONGTEXT NOT NULL,
    channel_versions     LONGTEXT NOT NULL,
    created_at           DATETIME(6) NOT NULL,
    PRIMARY KEY (thread_id, checkpoint_ns, checkpoint_id),
    INDEX checkpoints_by_run (run_id)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;

-- Written once per version: a checkpoint that did not change a channel points at the blob stored before.
CREATE TABLE IF NOT EXISTS checkpoint_blobs (
    thread_id     VARCHAR(255) NOT NULL,
    checkpoint_ns VARCHAR(255) NOT NULL,
    channel       VARCHAR(128) NOT NULL,
    version       VARCHAR(128) NOT NULL,
    type          VARCHAR(64) NOT NULL,
    `blob`        LONGBLOB,
    PRIMARY KEY (thread_id, checkpoint_ns, channel, version)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;

-- No foreign key to checkpoints: a framework may save a task's writes while the checkpoint they follow
-- is still being saved.
CREATE TABLE IF NOT EXISTS checkpoint_writes (
    thread_id     VARCHAR(192) NOT NULL,
    checkpoint_ns VARCHAR(192) NOT NULL,
    checkpoint_id VARCHAR(128) NOT NULL,
    task_id       VARCHAR(128) NOT NULL,
    idx           INTEGER NOT NULL,
    channel       VARCHAR(255) NOT NULL,
    type          VARCHAR(64) NOT NULL,
    `blob`        LONGBLOB,
    task_path     VARCHAR(1024) NOT NULL DEFAULT '',
    PRIMARY KEY (thread_id, checkpoint_ns, checkpoint_id, task_id, idx)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;
