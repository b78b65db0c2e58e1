-- Graph checkpoints (LangGraph's saver): a checkpoint row per (thread, namespace, id), each channel's value
-- stored once per version, and the pending writes of the tasks that ran after a checkpoint.
-- Values are the framework serializer's bytes (type tag + BLOB); metadata and channel_versions are JSON
-- TEXT (metadata is filtered in SQL, channel_versions joins a checkpoint to its blobs).

CREATE TABLE checkpoints (
    thread_id            TEXT NOT NULL,
    checkpoint_ns        TEXT NOT NULL,
    checkpoint_id        TEXT NOT NULL,
    parent_checkpoint_id TEXT,
    run_id               TEXT,
    type                 TEXT NOT NULL,
    checkpoint           BLOB NOT NULL,
    metadata             TEXT NOT NULL,
    channel_versions     TEXT NOT NULL,
    created_at           INTEGER NOT NULL,
    PRIMARY KEY (thread_id, checkpoint_ns, checkpoint_id)
);
CREATE INDEX checkpoints_by_run ON checkpoints (run_id) WHERE run_id IS NOT NULL;

-- Written once per version: a checkpoint that did not change a channel points at the blob stored before.
CREATE TABLE checkpoint_blobs (
    thread_id     TEXT NOT NULL,
    checkpoint_ns TEXT NOT NULL,
    channel       TEXT NOT NULL,
    version       TEXT NOT NULL,
    type          TEXT NOT NULL,
    blob          BLOB,
    PRIMARY KEY (thread_id, checkpoint_ns, channel, version)
);

-- No foreign key to checkpoints: a framework may save a task's writes while the checkpoint they follow
-- is still being saved.
CREATE TABLE checkpoint_writes (
    thread_id     TEXT NOT NULL,
    checkpoint_ns TEXT NOT NULL,
    checkpoint_id TEXT NOT NULL,
    task_id       TEXT NOT NULL,
    idx           INTEGER NOT NULL,
    channel       TEXT NOT NULL,
    type          TEXT NOT NULL,
    blob          BLOB,
    task_path     TEXT NOT NULL DEFAULT '',
    PRIMARY KEY (thread_id, checkpoint_ns, checkpoint_id, task_id, idx)
);
