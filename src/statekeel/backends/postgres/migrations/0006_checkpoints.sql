-- Graph checkpoints (LangGraph's saver): a checkpoint row per (thread, namespace, id), each channel's value
-- stored once per version, and the pending writes of the tasks that ran after a checkpoint.
-- Values are the framework serializer's bytes (type tag + BYTEA); metadata (filtered in SQL) and
-- channel_versions (joins a checkpoint to its blobs) are JSONB. Keys use the "C" collation so listings
-- and cursors follow SQLite's byte order.

CREATE TABLE checkpoints (
    thread_id            TEXT COLLATE "C" NOT NULL,
    checkpoint_ns        TEXT COLLATE "C" NOT NULL,
    checkpoint_id        TEXT COLLATE "C" NOT NULL,
    parent_checkpoint_id TEXT COLLATE "C",
    run_id               TEXT,
    type                 TEXT NOT NULL,
    checkpoint           BYTEA NOT NULL,
    metadata             JSONB NOT NULL,
    channel_versions     JSONB NOT NULL,
    created_at           TIMESTAMPTZ NOT NULL,
    PRIMARY KEY (thread_id, checkpoint_ns, checkpoint_id)
);
CREATE INDEX checkpoints_by_run ON checkpoints (run_id) WHERE run_id IS NOT NULL;

-- Written once per version: a checkpoint that did not change a channel points at the blob stored before.
CREATE TABLE checkpoint_blobs (
    thread_id     TEXT COLLATE "C" NOT NULL,
    checkpoint_ns TEXT COLLATE "C" NOT NULL,
    channel       TEXT COLLATE "C" NOT NULL,
    version       TEXT COLLATE "C" NOT NULL,
    type          TEXT NOT NULL,
    blob          BYTEA,
    PRIMARY KEY (thread_id, checkpoint_ns, channel, version)
);

-- No foreign key to checkpoints: a framework may save a task's writes while the checkpoint they follow
-- is still being saved.
CREATE TABLE checkpoint_writes (
    thread_id     TEXT COLLATE "C" NOT NULL,
    checkpoint_ns TEXT COLLATE "C" NOT NULL,
    checkpoint_id TEXT COLLATE "C" NOT NULL,
    task_id       TEXT COLLATE "C" NOT NULL,
    idx           INTEGER NOT NULL,
    channel       TEXT NOT NULL,
    type          TEXT NOT NULL,
    blob          BYTEA,
    task_path     TEXT COLLATE "C" NOT NULL DEFAULT '',
    PRIMARY KEY (thread_id, checkpoint_ns, checkpoint_id, task_id, idx)
);
