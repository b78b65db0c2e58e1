-- Memories, their history, episodes, relations, contradictions and the access log. Parameters are
-- numbered (?1, ?2 …) in the same order as PostgreSQL's.

-- name: memory_live_by_key
SELECT * FROM memories
WHERE type = ?1 AND scope = ?2 AND key = ?3 AND deleted_at IS NULL AND superseded_by IS NULL;

-- name: memory_insert
-- The live-key unique index refuses a second live memory of (type, scope, key): nothing is returned.
INSERT INTO memories (id, type, scope, key, content, data, confidence, source, created_at, updated_at,
                      expires_at)
VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?9, ?10)
ON CONFLICT DO NOTHING
RETURNING *;

-- name: memory_update
UPDATE memories
SET content = ?1, data = ?2, confidence = ?3, source = ?4, expires_at = ?5, updated_at = ?6,
    version = version + 1
WHERE id = ?7 AND version = ?8 AND deleted_at IS NULL AND superseded_by IS NULL
RETURNING *;

-- name: memory_get
SELECT * FROM memories WHERE id = ?1;

-- name: memory_get_for_update
-- SQLite has one writer: nobody changes the row during this transaction.
SELECT * FROM memories WHERE id = ?1;

-- name: memory_get_for_share
SELECT * FROM memories WHERE id = ?1;

-- name: memory_forget
UPDATE memories SET deleted_at = ?1, updated_at = ?1, version = version + 1
WHERE id = ?2 AND version = ?3 AND deleted_at IS NULL
RETURNING *;

-- name: memory_supersede
UPDATE memories SET superseded_by = ?1, updated_at = ?2, version = version + 1
WHERE id = ?3 AND version = ?4 AND deleted_at IS NULL AND superseded_by IS NULL
RETURNING *;

-- name: memory_event_insert
INSERT INTO memory_events (memory_id, version, event, state, actor, reason, at)
VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7);

-- name: memory_event_list
SELECT * FROM memory_events WHERE memory_id = ?1 ORDER BY version;

-- name: memory_query
SELECT * FROM memories
WHERE (updated_at, id) < (?8, ?9)
  AND (?1 IS NULL OR type = ?1) AND (?2 IS NULL OR scope = ?2) AND (?3 IS NULL OR key = ?3)
  AND (?4 IS NULL OR confidence >= ?4) AND (?5 OR deleted_at IS NULL) AND (?6 OR superseded_by IS NULL)
  AND (?7 IS NULL OR expires_at IS NULL OR expires_at > ?7)
ORDER BY updated_at DESC, id DESC LIMIT ?10;

-- name: memory_query_scope
SELECT * FROM memories
WHERE scope = ?2 AND (updated_at, id) < (?8, ?9)
  AND (?1 IS NULL OR type = ?1) AND (?3 IS NULL OR key = ?3)
  AND (?4 IS NULL OR confidence >= ?4) AND (?5 OR deleted_at IS NULL) AND (?6 OR superseded_by IS NULL)
  AND (?7 IS NULL OR expires_at IS NULL OR expires_at > ?7)
ORDER BY updated_at DESC, id DESC LIMIT ?10;

-- name: memory_query_type_scope
SELECT * FROM memories
WHERE type = ?1 AND scope = ?2 AND (updated_at, id) < (?8, ?9)
  AND (?3 IS NULL OR key = ?3)
  AND (?4 IS NULL OR confidence >= ?4) AND (?5 OR deleted_at IS NULL) AND (?6 OR superseded_by IS NULL)
  AND (?7 IS NULL OR expires_at IS NULL OR expires_at > ?7)
ORDER BY updated_at DESC, id DESC LIMIT ?10;

-- name: memory_query_key
SELECT * FROM memories
WHERE key = ?3 AND (updated_at, id) < (?8, ?9)
  AND (?1 IS NULL OR type = ?1) AND (?2 IS NULL OR scope = ?2)
  AND (?4 IS NULL OR confidence >= ?4) AND (?5 OR deleted_at IS NULL) AND (?6 OR superseded_by IS NULL)
  AND (?7 IS NULL OR expires_at IS NULL OR expires_at > ?7)
ORDER BY updated_at DESC, id DESC LIMIT ?10;

-- name: memory_query_prefix
-- Scopes starting with a prefix: the range [?2, ?11) of the scope index, the bounds computed by the caller.
-- INDEXED BY: without statistics the planner could walk memories_by_updated (the whole table) to skip the
-- sort; the range holds only the prefix's memories.
SELECT * FROM memories INDEXED BY memories_by_scope
WHERE scope >= ?2 AND scope < ?11 AND (updated_at, id) < (?8, ?9)
  AND (?1 IS NULL OR type = ?1) AND (?3 IS NULL OR key = ?3)
  AND (?4 IS NULL OR confidence >= ?4) AND (?5 OR deleted_at IS NULL) AND (?6 OR superseded_by IS NULL)
  AND (?7 IS NULL OR expires_at IS NULL OR expires_at > ?7)
ORDER BY updated_at DESC, id DESC LIMIT ?10;

-- name: memory_query_type_prefix
SELECT * FROM memories INDEXED BY memories_by_type_scope
WHERE type = ?1 AND scope >= ?2 AND scope < ?11 AND (updated_at, id) < (?8, ?9)
  AND (?3 IS NULL OR key = ?3)
  AND (?4 IS NULL OR confidence >= ?4) AND (?5 OR deleted_at IS NULL) AND (?6 OR superseded_by IS NULL)
  AND (?7 IS NULL OR expires_at IS NULL OR expires_at > ?7)
ORDER BY updated_at DESC, id DESC LIMIT ?10;

-- name: memory_scopes
-- The distinct scopes in [?2, ?3) holding a live memory (of type ?1 when given), in byte order; ?4 false
-- leaves out ?2 itself (the last scope of the previous page).
SELECT DISTINCT scope FROM memories INDEXED BY memories_by_scope
WHERE scope >= ?2 AND scope < ?3 AND (?4 OR scope <> ?2)
  AND (?1 IS NULL OR type = ?1) AND deleted_at IS NULL AND superseded_by IS NULL
  AND (expires_at IS NULL OR expires_at > ?5)
ORDER BY scope LIMIT ?6;

-- name: memory_scopes_type
SELECT DISTINCT scope FROM memories INDEXED BY memories_by_type_scope
WHERE type = ?1 AND scope >= ?2 AND scope < ?3 AND (?4 OR scope <> ?2)
  AND deleted_at IS NULL AND superseded_by IS NULL
  AND (expires_at IS NULL OR expires_at > ?5)
ORDER BY scope LIMIT ?6;

-- name: memory_changed
SELECT * FROM memories WHERE (updated_at, id) > (?1, ?2) ORDER BY updated_at, id LIMIT ?3;

-- name: episode_insert
-- With the session's rewind count, read in the same statement: the seqs are that count's.
INSERT INTO memory_episodes (id, session_key, summary, first_seq, upto_seq, entities, importance, created_at,
                             rewinds)
VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, (SELECT rewinds FROM sessions WHERE key = ?2))
RETURNING *;

-- name: episode_list
SELECT * FROM memory_episodes ORDER BY created_at DESC, id DESC LIMIT ?1;

-- name: episode_list_session
SELECT * FROM memory_episodes WHERE session_key = ?1 ORDER BY created_at DESC, id DESC LIMIT ?2;

-- name: relation_insert
INSERT INTO memory_relations (id, subject, relation, object, weight, valid_from, valid_to,
                              source_memory_id, created_at)
VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)
RETURNING *;

-- name: relation_get_for_update
SELECT * FROM memory_relations WHERE id = ?1;

-- name: relation_end
UPDATE memory_relations SET valid_to = ?1 WHERE id = ?2 AND valid_to IS NULL RETURNING *;

-- name: relation_at
SELECT * FROM memory_relations
WHERE (subject = ?1 OR object = ?1) AND (?2 IS NULL OR relation = ?2)
  AND valid_from <= ?3 AND (valid_to IS NULL OR valid_to > ?3)
ORDER BY valid_from, id;

-- name: contradiction_insert
INSERT INTO memory_contradictions (id, memory_a, memory_b, description, created_at)
VALUES (?1, ?2, ?3, ?4, ?5)
RETURNING *;

-- name: contradiction_get
SELECT * FROM memory_contradictions WHERE id = ?1;

-- name: contradiction_resolve
UPDATE memory_contradictions SET resolution = ?1, resolved_at = ?2
WHERE id = ?3 AND resolved_at IS NULL
RETURNING *;

-- name: contradiction_open
SELECT * FROM memory_contradictions WHERE resolved_at IS NULL ORDER BY created_at, id LIMIT ?1;

-- name: access_insert
-- A batch whose write was interrupted is written again: an entry already stored is skipped.
INSERT INTO memory_accesses (id, memory_id, at, context_query) VALUES (?1, ?2, ?3, ?4)
ON CONFLICT (id) DO NOTHING;

-- name: access_list
SELECT * FROM memory_accesses WHERE memory_id = ?1 ORDER BY at DESC, id DESC LIMIT ?2;
