-- What `statekeel import --from ...` reads from the databases of other frameworks' own stores (SQLite,
-- opened read-only). Named queries, loaded by name; table names are those the frameworks create.

-- name: source_tables
SELECT name FROM sqlite_master WHERE type = 'table';

-- name: source_columns
SELECT name FROM pragma_table_info(?1);

-- name: agents_session_ids
-- Every session with an item, in the order they were first written.
SELECT session_id FROM agent_messages GROUP BY session_id ORDER BY min(id);

-- name: agents_items
SELECT message_data FROM agent_messages WHERE session_id = ?1 ORDER BY id;

-- name: langgraph_checkpoints
SELECT thread_id, checkpoint_ns, checkpoint_id, parent_checkpoint_id, type, checkpoint, metadata
FROM checkpoints ORDER BY thread_id, checkpoint_ns, checkpoint_id;

-- name: langgraph_writes
SELECT thread_id, checkpoint_ns, checkpoint_id, task_id, task_path, idx, channel, type, value
FROM writes ORDER BY thread_id, checkpoint_ns, checkpoint_id, task_id, idx;

-- name: langgraph_writes_without_path
-- Databases of savers older than the task_path column.
SELECT thread_id, checkpoint_ns, checkpoint_id, task_id, '' AS task_path, idx, channel, type, value
FROM writes ORDER BY thread_id, checkpoint_ns, checkpoint_id, task_id, idx;
