-- Erasure (store.erase): everything about one subject. Candidates are read in `key` order; every delete
-- re-checks in its own WHERE what made its row a candidate (the session still names the subject, the
-- memory is still in the subject's scope). Parameters ($1, $2 …) are in the same order as SQLite's ?1, ?2.

-- name: erase_sessions_page
-- Sessions whose `key` is the subject or whose metadata names it as "subject" (a string), and their forks
-- (and forks of forks: a fork's history is its parent's prefix), after a `key`.
WITH RECURSIVE tree (`key`) AS (
    SELECT `key` FROM sessions WHERE `key` = $1 OR parent_key = $1 OR (JSON_VALUE(metadata, '$."subject"') = $1 AND JSON_TYPE(JSON_EXTRACT(metadata, '$."subject"')) = 'STRING')
    UNION
    SELECT s.`key` FROM sessions s JOIN tree t ON s.parent_key = t.`key`
)
SELECT `key` FROM tree WHERE `key` > $2 ORDER BY `key` LIMIT $3;

-- name: erase_session_check
-- Whether the session of a `key` is still the subject's (no row: none; then only what is named after the
-- `key` goes): its `key` or metadata names the subject, or one of its ancestors' does (it is a fork, or a
-- fork of a fork, of the subject's session).
SELECT EXISTS (
    WITH RECURSIVE up (`key`, parent_key, metadata) AS (
        SELECT `key`, parent_key, metadata FROM sessions WHERE `key` = $1
        UNION ALL
        SELECT s.`key`, s.parent_key, s.metadata FROM sessions s JOIN up u ON s.`key` = u.parent_key
    )
    SELECT 1 FROM up WHERE up.`key` = $2 OR up.parent_key = $2 OR (JSON_VALUE(up.metadata, '$."subject"') = $2 AND JSON_TYPE(JSON_EXTRACT(up.metadata, '$."subject"')) = 'STRING')
) AS mine FROM sessions WHERE `key` = $1;

-- name: erase_session_check_lock
-- The same, holding the row's lock until the batch commits: its metadata cannot change in between.
SELECT EXISTS (
    WITH RECURSIVE up (`key`, parent_key, metadata) AS (
        SELECT `key`, parent_key, metadata FROM sessions WHERE `key` = $1
        UNION ALL
        SELECT s.`key`, s.parent_key, s.metadata FROM sessions s JOIN up u ON s.`key` = u.parent_key
    )
    SELECT 1 FROM up WHERE up.`key` = $2 OR up.parent_key = $2 OR (JSON_VALUE(up.metadata, '$."subject"') = $2 AND JSON_TYPE(JSON_EXTRACT(up.metadata, '$."subject"')) = 'STRING')
) AS mine FROM sessions WHERE `key` = $1 FOR UPDATE;

-- name: erase_session_forks
-- Every fork of a session, and forks of forks, deepest first: each is erased before the session it
-- forks from, so that its delete can still check its ancestry. Locked, with the session itself: no fork of any of them can be made until the batch commits.
WITH RECURSIVE tree (`key`, depth) AS (
    SELECT `key`, 1 FROM sessions WHERE parent_key = $1
    UNION ALL
    SELECT s.`key`, t.depth + 1 FROM sessions s JOIN tree t ON s.parent_key = t.`key`
)
SELECT s.`key` FROM sessions s JOIN tree t ON s.`key` = t.`key` ORDER BY t.depth DESC, s.`key`
FOR UPDATE;

-- name: erase_session_counts
SELECT (SELECT count(*) FROM sessions WHERE `key` = $1) AS sessions,
       (SELECT count(*) FROM messages WHERE session_key = $1) AS messages,
       (SELECT count(*) FROM message_archive WHERE session_key = $1) AS archived_messages,
       (SELECT count(*) FROM rewound_messages WHERE session_key = $1) AS rewound_messages,
       (SELECT count(*) FROM compressions WHERE session_key = $1) AS compressions,
       (SELECT count(*) FROM session_steps WHERE session_key = $1) AS tool_calls,
       (SELECT count(*) FROM file_changes WHERE session_key = $1) AS file_changes,
       (SELECT count(*) FROM traces WHERE trace_id = $1) AS traces,
       (SELECT count(*) FROM checkpoints WHERE thread_id = $1)
     + (SELECT count(*) FROM checkpoint_blobs WHERE thread_id = $1)
     + (SELECT count(*) FROM checkpoint_writes WHERE thread_id = $1) AS checkpoints;

-- name: erase_session_episodes
SELECT id FROM memory_episodes WHERE session_key = $1 ORDER BY id;

-- name: erase_session_episodes_delete
DELETE FROM memory_episodes WHERE session_key = $1;

-- name: erase_session_files
DELETE FROM file_changes WHERE session_key = $1;

-- name: erase_session_traces
-- The spans of the trace named after the session.
DELETE FROM traces WHERE trace_id = $1;

-- name: erase_session_checkpoint_writes
DELETE FROM checkpoint_writes WHERE thread_id = $1;

-- name: erase_session_checkpoint_blobs
DELETE FROM checkpoint_blobs WHERE thread_id = $1;

-- name: erase_session_checkpoints
DELETE FROM checkpoints WHERE thread_id = $1;

-- name: erase_session_lease
-- Only a lease nobody holds: a live holder's fencing token must keep growing.
DELETE FROM session_leases WHERE session_key = $1 AND (owner IS NULL OR expires_at < $2);

-- name: erase_session_lease_held
SELECT count(*) AS n FROM session_leases WHERE session_key = $1 AND owner IS NOT NULL AND expires_at >= $2;

-- name: erase_session_delete
-- Messages, summaries, the archive and the tool-call journal follow by cascade. The reason, checked in
-- the statement: the session's `key` or metadata names the subject, or one of its ancestors' does (its
-- forks were deleted before it, so an ancestor is always still there to be checked).
DELETE FROM sessions
WHERE `key` = $1 AND EXISTS (
    WITH RECURSIVE up (`key`, parent_key, metadata) AS (
        SELECT `key`, parent_key, metadata FROM sessions WHERE `key` = $1
        UNION ALL
        SELECT s.`key`, s.parent_key, s.metadata FROM sessions s JOIN up u ON s.`key` = u.parent_key
    )
    SELECT 1 FROM up WHERE up.`key` = $2 OR up.parent_key = $2 OR (JSON_VALUE(up.metadata, '$."subject"') = $2 AND JSON_TYPE(JSON_EXTRACT(up.metadata, '$."subject"')) = 'STRING')
);

-- name: erase_traces_page
-- Spans whose attributes name the subject or one of its sessions ($4: a JSON array of session keys).
-- Spans of a trace named after one of the sessions go with that session (and are counted there).
SELECT trace_id, span_id FROM traces
WHERE (trace_id, span_id) > ($2, $3)
  AND trace_id NOT IN (SELECT r.id FROM JSON_TABLE($4, '$[*]' COLUMNS (id VARCHAR(1024) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin PATH '$')) r)
  AND ((JSON_VALUE(attributes, '$."subject"') = $1 AND JSON_TYPE(JSON_EXTRACT(attributes, '$."subject"')) = 'STRING')
       OR JSON_VALUE(attributes, '$."session_key"') IN (SELECT r.id FROM JSON_TABLE($4, '$[*]' COLUMNS (id VARCHAR(1024) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin PATH '$')) r)
       OR JSON_VALUE(attributes, '$."session.id"') IN (SELECT r.id FROM JSON_TABLE($4, '$[*]' COLUMNS (id VARCHAR(1024) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin PATH '$')) r))
ORDER BY trace_id, span_id LIMIT $5;

-- name: erase_trace_delete
DELETE FROM traces
WHERE trace_id = $1 AND span_id = $2
  AND ((JSON_VALUE(attributes, '$."subject"') = $3 AND JSON_TYPE(JSON_EXTRACT(attributes, '$."subject"')) = 'STRING')
       OR JSON_VALUE(attributes, '$."session_key"') IN (SELECT r.id FROM JSON_TABLE($4, '$[*]' COLUMNS (id VARCHAR(1024) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin PATH '$')) r)
       OR JSON_VALUE(attributes, '$."session.id"') IN (SELECT r.id FROM JSON_TABLE($4, '$[*]' COLUMNS (id VARCHAR(1024) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin PATH '$')) r));

-- name: erase_memories_page
SELECT id FROM memories WHERE scope = $1 AND id > $2 ORDER BY id LIMIT $3;

-- name: erase_memory_counts
SELECT (SELECT count(*) FROM memory_events WHERE memory_id = $1) AS memory_events,
       (SELECT count(*) FROM memory_accesses WHERE memory_id = $1) AS memory_accesses,
       -- A contradiction between two of the subject's memories goes with the first of them (id order).
       (SELECT count(*) FROM memory_contradictions c
        WHERE (c.memory_a = $1 AND NOT (c.memory_b < $1 AND c.memory_b IN (SELECT id FROM memories WHERE scope = $2)))
           OR (c.memory_b = $1 AND NOT (c.memory_a < $1 AND c.memory_a IN (SELECT id FROM memories WHERE scope = $2)))
       ) AS contradictions,
       (SELECT count(*) FROM memory_relations WHERE source_memory_id = $1) AS relations;

-- name: erase_memory_accesses
DELETE FROM memory_accesses WHERE memory_id = $1;

-- name: erase_memory_close_contradictions
-- An open contradiction is never deleted: it is resolved first (then it goes with its memory).
UPDATE memory_contradictions SET resolution = 'erased', resolved_at = $2
WHERE resolved_at IS NULL AND (memory_a = $1 OR memory_b = $1);

-- name: erase_memory_relations
DELETE FROM memory_relations WHERE source_memory_id = $1;

-- name: erase_memory_delete
-- Its history and its contradictions follow by cascade.
DELETE FROM memories WHERE id = $1 AND scope = $2;

-- name: erase_relations_page
-- Those a memory of the subject produced go with that memory (and are counted there).
SELECT id FROM memory_relations
WHERE (subject = $1 OR object = $1) AND id > $2
  AND (source_memory_id IS NULL OR source_memory_id NOT IN (SELECT id FROM memories WHERE scope = $1))
ORDER BY id LIMIT $3;

-- name: erase_relation_delete
DELETE FROM memory_relations WHERE id = $1 AND (subject = $2 OR object = $2);

-- name: erase_episodes_page
-- Episodes that name the subject among their entities (those of the subject's sessions, $4, go with
-- their session and are counted there).
SELECT id FROM memory_episodes
WHERE id > $2 AND JSON_CONTAINS(entities, JSON_ARRAY($1))
  AND session_key NOT IN (SELECT r.id FROM JSON_TABLE($4, '$[*]' COLUMNS (id VARCHAR(1024) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin PATH '$')) r)
ORDER BY id LIMIT $3;

-- name: erase_episode_delete
DELETE FROM memory_episodes WHERE id = $1 AND JSON_CONTAINS(entities, JSON_ARRAY($2));
