-- Verbatim table access for statekeel.copy_store: pages in primary-key order, batch inserts.
-- Text keys compare bytewise (SQLite BINARY, PostgreSQL) so both dialects page in the
-- same order and a destination always holds a prefix of its source: the resume point.

-- name: copy_table_exists
SELECT count(*) AS n FROM information_schema.tables
WHERE table_schema = DATABASE() AND table_name = $1;

-- name: copy_sessions_first
SELECT `key`, status, metadata, last_consolidated, head_seq, version, created_at, updated_at, open_calls,
       calls_owner, write_id, parent_key, parent_seq, rewinds
FROM sessions ORDER BY `key` LIMIT $1;

-- name: copy_sessions_after
SELECT `key`, status, metadata, last_consolidated, head_seq, version, created_at, updated_at, open_calls,
       calls_owner, write_id, parent_key, parent_seq, rewinds
FROM sessions WHERE `key` > $1
ORDER BY `key` LIMIT $2;

-- name: copy_sessions_last
SELECT `key` FROM sessions ORDER BY `key` DESC LIMIT 1;

-- name: copy_sessions_insert
INSERT INTO sessions (`key`, status, metadata, last_consolidated, head_seq, version, created_at, updated_at,
                      open_calls, calls_owner, write_id, parent_key, parent_seq, rewinds)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14);

-- name: copy_sessions_count
SELECT count(*) AS n FROM sessions;

-- name: copy_sessions_clear
DELETE FROM sessions;

-- name: copy_messages_first
SELECT session_key, seq, role, payload, created_at, `usage`
FROM messages ORDER BY session_key, seq LIMIT $1;

-- name: copy_messages_after
SELECT session_key, seq, role, payload, created_at, `usage`
FROM messages WHERE (session_key, seq) > ($1, $2)
ORDER BY session_key, seq LIMIT $3;

-- name: copy_messages_last
SELECT session_key, seq FROM messages ORDER BY session_key DESC, seq DESC LIMIT 1;

-- name: copy_messages_insert
INSERT INTO messages (session_key, seq, role, payload, created_at, `usage`)
VALUES ($1, $2, $3, $4, $5, $6);

-- name: copy_messages_count
SELECT count(*) AS n FROM messages;

-- name: copy_messages_clear
DELETE FROM messages;

-- name: copy_compressions_first
SELECT session_key, compression_id, first_seq, upto_seq, summary, created_at, kind
FROM compressions ORDER BY session_key, compression_id LIMIT $1;

-- name: copy_compressions_after
SELECT session_key, compression_id, first_seq, upto_seq, summary, created_at, kind
FROM compressions WHERE (session_key, compression_id) > ($1, $2)
ORDER BY session_key, compression_id LIMIT $3;

-- name: copy_compressions_last
SELECT session_key, compression_id FROM compressions ORDER BY session_key DESC, compression_id DESC LIMIT 1;

-- name: copy_compressions_insert
INSERT INTO compressions (session_key, compression_id, first_seq, upto_seq, summary, created_at, kind)
VALUES ($1, $2, $3, $4, $5, $6, $7);

-- name: copy_compressions_count
SELECT count(*) AS n FROM compressions;

-- name: copy_compressions_clear
DELETE FROM compressions;

-- name: copy_message_archive_first
SELECT session_key, compression_id, seq, role, payload, created_at, `usage`
FROM message_archive ORDER BY session_key, seq LIMIT $1;

-- name: copy_message_archive_after
SELECT session_key, compression_id, seq, role, payload, created_at, `usage`
FROM message_archive WHERE (session_key, seq) > ($1, $2)
ORDER BY session_key, seq LIMIT $3;

-- name: copy_message_archive_last
SELECT session_key, seq FROM message_archive ORDER BY session_key DESC, seq DESC LIMIT 1;

-- name: copy_message_archive_insert
INSERT INTO message_archive (session_key, compression_id, seq, role, payload, created_at, `usage`)
VALUES ($1, $2, $3, $4, $5, $6, $7);

-- name: copy_message_archive_count
SELECT count(*) AS n FROM message_archive;

-- name: copy_message_archive_clear
DELETE FROM message_archive;

-- name: copy_workflows_first
SELECT id, name, status, metadata, version, created_at, updated_at, started_at, completed_at
FROM workflows ORDER BY id LIMIT $1;

-- name: copy_workflows_after
SELECT id, name, status, metadata, version, created_at, updated_at, started_at, completed_at
FROM workflows WHERE id > $1
ORDER BY id LIMIT $2;

-- name: copy_workflows_last
SELECT id FROM workflows ORDER BY id DESC LIMIT 1;

-- name: copy_workflows_insert
INSERT INTO workflows (id, name, status, metadata, version, created_at, updated_at, started_at, completed_at)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9);

-- name: copy_workflows_count
SELECT count(*) AS n FROM workflows;

-- name: copy_workflows_clear
DELETE FROM workflows;

-- name: copy_tasks_first
SELECT id, workflow_id, parent_task_id, title, description, status, priority, result, error, retry_count, max_retries, metadata, version, lease_owner, lease_expires_at, lease_epoch, idempotency_key, created_at, updated_at, started_at, completed_at, transition_id, not_before
FROM tasks ORDER BY id LIMIT $1;

-- name: copy_tasks_after
SELECT id, workflow_id, parent_task_id, title, description, status, priority, result, error, retry_count, max_retries, metadata, version, lease_owner, lease_expires_at, lease_epoch, idempotency_key, created_at, updated_at, started_at, completed_at, transition_id, not_before
FROM tasks WHERE id > $1
ORDER BY id LIMIT $2;

-- name: copy_tasks_last
SELECT id FROM tasks ORDER BY id DESC LIMIT 1;

-- name: copy_tasks_insert
INSERT INTO tasks (id, workflow_id, parent_task_id, title, description, status, priority, result, error, retry_count, max_retries, metadata, version, lease_owner, lease_expires_at, lease_epoch, idempotency_key, created_at, updated_at, started_at, completed_at, transition_id, not_before)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, $18, $19, $20, $21, $22, $23);

-- name: copy_tasks_link
UPDATE tasks SET parent_task_id = $2
WHERE id = $1;

-- name: copy_tasks_count
SELECT count(*) AS n FROM tasks;

-- name: copy_tasks_clear
DELETE FROM tasks;

-- name: copy_workflow_steps_first
SELECT workflow_id, name, position, task_id, depends_on
FROM workflow_steps ORDER BY workflow_id, name LIMIT $1;

-- name: copy_workflow_steps_after
SELECT workflow_id, name, position, task_id, depends_on
FROM workflow_steps WHERE (workflow_id, name) > ($1, $2)
ORDER BY workflow_id, name LIMIT $3;

-- name: copy_workflow_steps_last
SELECT workflow_id, name FROM workflow_steps ORDER BY workflow_id DESC, name DESC LIMIT 1;

-- name: copy_workflow_steps_insert
INSERT INTO workflow_steps (workflow_id, name, position, task_id, depends_on)
VALUES ($1, $2, $3, $4, $5);

-- name: copy_workflow_steps_count
SELECT count(*) AS n FROM workflow_steps;

-- name: copy_workflow_steps_clear
DELETE FROM workflow_steps;

-- name: copy_task_steps_first
SELECT task_id, step_key, status, attempt, result, error, started_at, first_started_at, finished_at, attempt_id
FROM task_steps ORDER BY task_id, step_key LIMIT $1;

-- name: copy_task_steps_after
SELECT task_id, step_key, status, attempt, result, error, started_at, first_started_at, finished_at, attempt_id
FROM task_steps WHERE (task_id, step_key) > ($1, $2)
ORDER BY task_id, step_key LIMIT $3;

-- name: copy_task_steps_last
SELECT task_id, step_key FROM task_steps ORDER BY task_id DESC, step_key DESC LIMIT 1;

-- name: copy_task_steps_insert
INSERT INTO task_steps (task_id, step_key, status, attempt, result, error, started_at, first_started_at, finished_at, attempt_id)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10);

-- name: copy_task_steps_count
SELECT count(*) AS n FROM task_steps;

-- name: copy_task_steps_clear
DELETE FROM task_steps;

-- name: copy_session_steps_first
SELECT session_key, call_id, status, attempt, owner, result_seq, error, started_at, finished_at
FROM session_steps ORDER BY session_key, call_id LIMIT $1;

-- name: copy_session_steps_after
SELECT session_key, call_id, status, attempt, owner, result_seq, error, started_at, finished_at
FROM session_steps WHERE (session_key, call_id) > ($1, $2)
ORDER BY session_key, call_id LIMIT $3;

-- name: copy_session_steps_last
SELECT session_key, call_id FROM session_steps ORDER BY session_key DESC, call_id DESC LIMIT 1;

-- name: copy_session_steps_insert
INSERT INTO session_steps (session_key, call_id, status, attempt, owner, result_seq, error, started_at,
                           finished_at)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9);

-- name: copy_session_steps_count
SELECT count(*) AS n FROM session_steps;

-- name: copy_session_steps_clear
DELETE FROM session_steps;

-- name: copy_audit_log_first
SELECT seq, kind, actor, subject, data, created_at, prev_hash, hash, mac
FROM audit_log ORDER BY seq LIMIT $1;

-- name: copy_audit_log_after
SELECT seq, kind, actor, subject, data, created_at, prev_hash, hash, mac
FROM audit_log WHERE seq > $1
ORDER BY seq LIMIT $2;

-- name: copy_audit_log_last
SELECT seq FROM audit_log ORDER BY seq DESC LIMIT 1;

-- name: copy_audit_log_insert
INSERT INTO audit_log (seq, kind, actor, subject, data, created_at, prev_hash, hash, mac)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9);

-- name: copy_audit_log_count
SELECT count(*) AS n FROM audit_log;

-- name: copy_audit_log_clear
DELETE FROM audit_log;

-- name: copy_approvals_first
SELECT id, subject, action, args, args_hash, status, requested_by, requested_at, expires_at, decided_by, decided_at, reason, consumed_by, consumed_at, version
FROM approvals ORDER BY id LIMIT $1;

-- name: copy_approvals_after
SELECT id, subject, action, args, args_hash, status, requested_by, requested_at, expires_at, decided_by, decided_at, reason, consumed_by, consumed_at, version
FROM approvals WHERE id > $1
ORDER BY id LIMIT $2;

-- name: copy_approvals_last
SELECT id FROM approvals ORDER BY id DESC LIMIT 1;

-- name: copy_approvals_insert
INSERT INTO approvals (id, subject, action, args, args_hash, status, requested_by, requested_at, expires_at, decided_by, decided_at, reason, consumed_by, consumed_at, version)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15);

-- name: copy_approvals_count
SELECT count(*) AS n FROM approvals;

-- name: copy_approvals_clear
DELETE FROM approvals;

-- name: copy_traces_first
SELECT trace_id, span_id, parent_span_id, name, kind, status, attributes, started_at, ended_at
FROM traces ORDER BY trace_id, span_id LIMIT $1;

-- name: copy_traces_after
SELECT trace_id, span_id, parent_span_id, name, kind, status, attributes, started_at, ended_at
FROM traces WHERE (trace_id, span_id) > ($1, $2)
ORDER BY trace_id, span_id LIMIT $3;

-- name: copy_traces_last
SELECT trace_id, span_id FROM traces ORDER BY trace_id DESC, span_id DESC LIMIT 1;

-- name: copy_traces_insert
INSERT INTO traces (trace_id, span_id, parent_span_id, name, kind, status, attributes, started_at, ended_at)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9);

-- name: copy_traces_count
SELECT count(*) AS n FROM traces;

-- name: copy_traces_clear
DELETE FROM traces;

-- name: copy_trace_counters_first
SELECT name, value FROM trace_counters ORDER BY name LIMIT $1;

-- name: copy_trace_counters_after
SELECT name, value FROM trace_counters WHERE name > $1
ORDER BY name LIMIT $2;

-- name: copy_trace_counters_last
SELECT name FROM trace_counters ORDER BY name DESC LIMIT 1;

-- name: copy_trace_counters_insert
INSERT INTO trace_counters (name, value)
VALUES ($1, $2);

-- name: copy_trace_counters_count
SELECT count(*) AS n FROM trace_counters;

-- name: copy_trace_counters_clear
DELETE FROM trace_counters;

-- name: copy_schedules_first
SELECT id, name, cron, every_seconds, timezone, task, catch_up, catch_up_window, overlap, paused, fired_through, next_fire_at, last_slot, last_task_id, version, created_at, updated_at
FROM schedules ORDER BY id LIMIT $1;

-- name: copy_schedules_after
SELECT id, name, cron, every_seconds, timezone, task, catch_up, catch_up_window, overlap, paused, fired_through, next_fire_at, last_slot, last_task_id, version, created_at, updated_at
FROM schedules WHERE id > $1
ORDER BY id LIMIT $2;

-- name: copy_schedules_last
SELECT id FROM schedules ORDER BY id DESC LIMIT 1;

-- name: copy_schedules_insert
INSERT INTO schedules (id, name, cron, every_seconds, timezone, task, catch_up, catch_up_window, overlap, paused, fired_through, next_fire_at, last_slot, last_task_id, version, created_at, updated_at)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17);

-- name: copy_schedules_count
SELECT count(*) AS n FROM schedules;

-- name: copy_schedules_clear
DELETE FROM schedules;

-- name: copy_store_identity
-- The database on this server (whatever host name or port spelling reached it): the server's host name,
-- port and data directory tell two servers apart.
SELECT CONCAT('mysql:', DATABASE(), '@', @@hostname, ':', @@port, ':', @@datadir) AS id;

-- name: copy_memories_first
SELECT id, type, scope, `key`, content, data, confidence, source, created_at, updated_at, expires_at, superseded_by, deleted_at, version
FROM memories ORDER BY id LIMIT $1;

-- name: copy_memories_after
SELECT id, type, scope, `key`, content, data, confidence, source, created_at, updated_at, expires_at, superseded_by, deleted_at, version
FROM memories WHERE id > $1
ORDER BY id LIMIT $2;

-- name: copy_memories_last
SELECT id FROM memories ORDER BY id DESC LIMIT 1;

-- name: copy_memories_insert
INSERT INTO memories (id, type, scope, `key`, content, data, confidence, source, created_at, updated_at, expires_at, superseded_by, deleted_at, version)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14);

-- name: copy_memories_count
SELECT count(*) AS n FROM memories;

-- name: copy_memories_clear
DELETE FROM memories;

-- name: copy_memory_events_first
SELECT memory_id, version, event, state, actor, reason, at
FROM memory_events ORDER BY memory_id, version LIMIT $1;

-- name: copy_memory_events_after
SELECT memory_id, version, event, state, actor, reason, at
FROM memory_events WHERE (memory_id, version) > ($1, $2)
ORDER BY memory_id, version LIMIT $3;

-- name: copy_memory_events_last
SELECT memory_id, version FROM memory_events ORDER BY memory_id DESC, version DESC LIMIT 1;

-- name: copy_memory_events_insert
INSERT INTO memory_events (memory_id, version, event, state, actor, reason, at)
VALUES ($1, $2, $3, $4, $5, $6, $7);

-- name: copy_memory_events_count
SELECT count(*) AS n FROM memory_events;

-- name: copy_memory_events_clear
DELETE FROM memory_events;

-- name: copy_memory_episodes_first
SELECT id, session_key, summary, first_seq, upto_seq, entities, importance, created_at, rewinds
FROM memory_episodes ORDER BY id LIMIT $1;

-- name: copy_memory_episodes_after
SELECT id, session_key, summary, first_seq, upto_seq, entities, importance, created_at, rewinds
FROM memory_episodes WHERE id > $1
ORDER BY id LIMIT $2;

-- name: copy_memory_episodes_last
SELECT id FROM memory_episodes ORDER BY id DESC LIMIT 1;

-- name: copy_memory_episodes_insert
INSERT INTO memory_episodes (id, session_key, summary, first_seq, upto_seq, entities, importance, created_at,
                             rewinds)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9);

-- name: copy_memory_episodes_count
SELECT count(*) AS n FROM memory_episodes;

-- name: copy_memory_episodes_clear
DELETE FROM memory_episodes;

-- name: copy_memory_relations_first
SELECT id, subject, relation, object, weight, valid_from, valid_to, source_memory_id, created_at
FROM memory_relations ORDER BY id LIMIT $1;

-- name: copy_memory_relations_after
SELECT id, subject, relation, object, weight, valid_from, valid_to, source_memory_id, created_at
FROM memory_relations WHERE id > $1
ORDER BY id LIMIT $2;

-- name: copy_memory_relations_last
SELECT id FROM memory_relations ORDER BY id DESC LIMIT 1;

-- name: copy_memory_relations_insert
INSERT INTO memory_relations (id, subject, relation, object, weight, valid_from, valid_to, source_memory_id, created_at)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9);

-- name: copy_memory_relations_count
SELECT count(*) AS n FROM memory_relations;

-- name: copy_memory_relations_clear
DELETE FROM memory_relations;

-- name: copy_memory_contradictions_first
SELECT id, memory_a, memory_b, description, resolution, created_at, resolved_at
FROM memory_contradictions ORDER BY id LIMIT $1;

-- name: copy_memory_contradictions_after
SELECT id, memory_a, memory_b, description, resolution, created_at, resolved_at
FROM memory_contradictions WHERE id > $1
ORDER BY id LIMIT $2;

-- name: copy_memory_contradictions_last
SELECT id FROM memory_contradictions ORDER BY id DESC LIMIT 1;

-- name: copy_memory_contradictions_insert
INSERT INTO memory_contradictions (id, memory_a, memory_b, description, resolution, created_at, resolved_at)
VALUES ($1, $2, $3, $4, $5, $6, $7);

-- name: copy_memory_contradictions_count
SELECT count(*) AS n FROM memory_contradictions;

-- name: copy_memory_contradictions_clear
DELETE FROM memory_contradictions;

-- name: copy_memory_accesses_first
SELECT id, memory_id, at, context_query
FROM memory_accesses ORDER BY id LIMIT $1;

-- name: copy_memory_accesses_after
SELECT id, memory_id, at, context_query
FROM memory_accesses WHERE id > $1
ORDER BY id LIMIT $2;

-- name: copy_memory_accesses_last
SELECT id FROM memory_accesses ORDER BY id DESC LIMIT 1;

-- name: copy_memory_accesses_insert
INSERT INTO memory_accesses (id, memory_id, at, context_query)
VALUES ($1, $2, $3, $4);

-- name: copy_memory_accesses_count
SELECT count(*) AS n FROM memory_accesses;

-- name: copy_memory_accesses_clear
DELETE FROM memory_accesses;

-- name: copy_file_changes_first
SELECT path, seq, checksum, size, action, task_id, session_key, recorded_at
FROM file_changes ORDER BY path, seq LIMIT $1;

-- name: copy_file_changes_after
SELECT path, seq, checksum, size, action, task_id, session_key, recorded_at
FROM file_changes WHERE (path, seq) > ($1, $2)
ORDER BY path, seq LIMIT $3;

-- name: copy_file_changes_last
SELECT path, seq FROM file_changes ORDER BY path DESC, seq DESC LIMIT 1;

-- name: copy_file_changes_insert
INSERT INTO file_changes (path, seq, checksum, size, action, task_id, session_key, recorded_at)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8);

-- name: copy_file_changes_count
SELECT count(*) AS n FROM file_changes;

-- name: copy_file_changes_clear
DELETE FROM file_changes;

-- Graph checkpoints (`key` columns compare bytewise in both dialects).

-- name: copy_checkpoints_first
SELECT thread_id, checkpoint_ns, checkpoint_id, parent_checkpoint_id, run_id, type, checkpoint, metadata, channel_versions, created_at
FROM checkpoints ORDER BY thread_id, checkpoint_ns, checkpoint_id LIMIT $1;

-- name: copy_checkpoints_after
SELECT thread_id, checkpoint_ns, checkpoint_id, parent_checkpoint_id, run_id, type, checkpoint, metadata, channel_versions, created_at
FROM checkpoints WHERE (thread_id, checkpoint_ns, checkpoint_id) > ($1, $2, $3)
ORDER BY thread_id, checkpoint_ns, checkpoint_id LIMIT $4;

-- name: copy_checkpoints_last
SELECT thread_id, checkpoint_ns, checkpoint_id FROM checkpoints ORDER BY thread_id DESC, checkpoint_ns DESC, checkpoint_id DESC LIMIT 1;

-- name: copy_checkpoints_insert
INSERT INTO checkpoints (thread_id, checkpoint_ns, checkpoint_id, parent_checkpoint_id, run_id, type, checkpoint, metadata, channel_versions, created_at)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10);

-- name: copy_checkpoints_count
SELECT count(*) AS n FROM checkpoints;

-- name: copy_checkpoints_clear
DELETE FROM checkpoints;

-- name: copy_checkpoint_blobs_first
SELECT thread_id, checkpoint_ns, channel, version, type, `blob`
FROM checkpoint_blobs ORDER BY thread_id, checkpoint_ns, channel, version LIMIT $1;

-- name: copy_checkpoint_blobs_after
SELECT thread_id, checkpoint_ns, channel, version, type, `blob`
FROM checkpoint_blobs WHERE (thread_id, checkpoint_ns, channel, version) > ($1, $2, $3, $4)
ORDER BY thread_id, checkpoint_ns, channel, version LIMIT $5;

-- name: copy_checkpoint_blobs_last
SELECT thread_id, checkpoint_ns, channel, version FROM checkpoint_blobs ORDER BY thread_id DESC, checkpoint_ns DESC, channel DESC, version DESC LIMIT 1;

-- name: copy_checkpoint_blobs_insert
INSERT INTO checkpoint_blobs (thread_id, checkpoint_ns, channel, version, type, `blob`)
VALUES ($1, $2, $3, $4, $5, $6);

-- name: copy_checkpoint_blobs_count
SELECT count(*) AS n FROM checkpoint_blobs;

-- name: copy_checkpoint_blobs_clear
DELETE FROM checkpoint_blobs;

-- name: copy_checkpoint_writes_first
SELECT thread_id, checkpoint_ns, checkpoint_id, task_id, idx, channel, type, `blob`, task_path
FROM checkpoint_writes ORDER BY thread_id, checkpoint_ns, checkpoint_id, task_id, idx LIMIT $1;

-- name: copy_checkpoint_writes_after
SELECT thread_id, checkpoint_ns, checkpoint_id, task_id, idx, channel, type, `blob`, task_path
FROM checkpoint_writes WHERE (thread_id, checkpoint_ns, checkpoint_id, task_id, idx) > ($1, $2, $3, $4, $5)
ORDER BY thread_id, checkpoint_ns, checkpoint_id, task_id, idx LIMIT $6;

-- name: copy_checkpoint_writes_last
SELECT thread_id, checkpoint_ns, checkpoint_id, task_id, idx FROM checkpoint_writes ORDER BY thread_id DESC, checkpoint_ns DESC, checkpoint_id DESC, task_id DESC, idx DESC LIMIT 1;

-- name: copy_checkpoint_writes_insert
INSERT INTO checkpoint_writes (thread_id, checkpoint_ns, checkpoint_id, task_id, idx, channel, type, `blob`, task_path)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9);

-- name: copy_checkpoint_writes_count
SELECT count(*) AS n FROM checkpoint_writes;

-- name: copy_checkpoint_writes_clear
DELETE FROM checkpoint_writes;

-- Vectors and the sources they follow.

-- name: copy_vector_models_first
SELECT model, dim, generation, removals, created_at
FROM vector_models ORDER BY model LIMIT $1;

-- name: copy_vector_models_after
SELECT model, dim, generation, removals, created_at
FROM vector_models WHERE model > $1
ORDER BY model LIMIT $2;

-- name: copy_vector_models_last
SELECT model FROM vector_models ORDER BY model DESC LIMIT 1;

-- name: copy_vector_models_insert
INSERT INTO vector_models (model, dim, generation, removals, created_at)
VALUES ($1, $2, $3, $4, $5);

-- name: copy_vector_models_count
SELECT count(*) AS n FROM vector_models;

-- name: copy_vector_models_clear
DELETE FROM vector_models;

-- name: copy_vectors_first
SELECT vec_id, model, source_id, source_version, embedding, metadata, generation, updated_at
FROM vectors ORDER BY vec_id LIMIT $1;

-- name: copy_vectors_after
SELECT vec_id, model, source_id, source_version, embedding, metadata, generation, updated_at
FROM vectors WHERE vec_id > $1
ORDER BY vec_id LIMIT $2;

-- name: copy_vectors_last
SELECT vec_id FROM vectors ORDER BY vec_id DESC LIMIT 1;

-- name: copy_vectors_insert
INSERT INTO vectors (vec_id, model, source_id, source_version, embedding, metadata, generation, updated_at)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8);

-- name: copy_vectors_count
SELECT count(*) AS n FROM vectors;

-- name: copy_vectors_clear
DELETE FROM vectors;

-- name: copy_vector_sources_first
SELECT source_id, kind, version, indexed_version, changed_at, gone_at
FROM vector_sources ORDER BY source_id LIMIT $1;

-- name: copy_vector_sources_after
SELECT source_id, kind, version, indexed_version, changed_at, gone_at
FROM vector_sources WHERE source_id > $1
ORDER BY source_id LIMIT $2;

-- name: copy_vector_sources_last
SELECT source_id FROM vector_sources ORDER BY source_id DESC LIMIT 1;

-- name: copy_vector_sources_insert
INSERT INTO vector_sources (source_id, kind, version, indexed_version, changed_at, gone_at)
VALUES ($1, $2, $3, $4, $5, $6);

-- name: copy_vector_sources_count
SELECT count(*) AS n FROM vector_sources;

-- name: copy_vector_sources_clear
DELETE FROM vector_sources;

-- name: copy_vector_cursors_first
SELECT name, at, id
FROM vector_cursors ORDER BY name LIMIT $1;

-- name: copy_vector_cursors_after
SELECT name, at, id
FROM vector_cursors WHERE name > $1
ORDER BY name LIMIT $2;

-- name: copy_vector_cursors_last
SELECT name FROM vector_cursors ORDER BY name DESC LIMIT 1;

-- name: copy_vector_cursors_insert
INSERT INTO vector_cursors (name, at, id)
VALUES ($1, $2, $3);

-- name: copy_vector_cursors_count
SELECT count(*) AS n FROM vector_cursors;

-- name: copy_vector_cursors_clear
DELETE FROM vector_cursors;

-- name: copy_rewound_messages_first
SELECT session_key, compression_id, seq, role, payload, created_at, `usage`
FROM rewound_messages ORDER BY session_key, compression_id, seq LIMIT $1;

-- name: copy_rewound_messages_after
SELECT session_key, compression_id, seq, role, payload, created_at, `usage`
FROM rewound_messages WHERE (session_key, compression_id, seq) > ($1, $2, $3)
ORDER BY session_key, compression_id, seq LIMIT $4;

-- name: copy_rewound_messages_last
SELECT session_key, compression_id, seq FROM rewound_messages
ORDER BY session_key DESC, compression_id DESC, seq DESC LIMIT 1;

-- name: copy_rewound_messages_insert
INSERT INTO rewound_messages (session_key, compression_id, seq, role, payload, created_at, `usage`)
VALUES ($1, $2, $3, $4, $5, $6, $7);

-- name: copy_rewound_messages_count
SELECT count(*) AS n FROM rewound_messages;

-- name: copy_rewound_messages_clear
DELETE FROM rewound_messages;
