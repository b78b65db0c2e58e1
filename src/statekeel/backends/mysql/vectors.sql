-- Vectors, their models and the sources they follow. Parameters ($1, $2 …) are in the same order as
-- the other dialects' ($1 / ?1 …).

-- name: vector_model_get
SELECT model, dim, generation, removals FROM vector_models WHERE model = $1;

-- name: vector_model_list
SELECT model, dim, generation, removals FROM vector_models ORDER BY model;

-- name: vector_model_insert
-- on duplicate PRIMARY
INSERT INTO vector_models (model, dim, created_at) VALUES ($1, $2, $3);

-- name: vector_model_bump
UPDATE vector_models SET generation = generation + 1, removals = removals + $2 WHERE model = $1;
SELECT generation FROM vector_models WHERE model = $1;

-- name: vector_get
SELECT * FROM vectors WHERE vec_id = $1;

-- name: vector_upsert
INSERT INTO vectors (vec_id, model, source_id, source_version, embedding, metadata, generation, updated_at)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8)
ON DUPLICATE KEY UPDATE
    source_id = VALUES(source_id), source_version = VALUES(source_version),
    embedding = VALUES(embedding), metadata = VALUES(metadata), generation = VALUES(generation),
    updated_at = VALUES(updated_at);

-- name: vector_delete
DELETE FROM vectors WHERE vec_id = $1 RETURNING model, source_id;

-- name: vector_delete_source
DELETE FROM vectors WHERE source_id = $1;

-- name: vector_by_source
SELECT * FROM vectors WHERE source_id = $1 ORDER BY model, vec_id;

-- name: vector_by_source_model
SELECT vec_id, metadata FROM vectors WHERE source_id = $1 AND model = $2 ORDER BY vec_id;

-- name: vector_load_all
SELECT vec_id, source_id, embedding, metadata, generation FROM vectors WHERE model = $1;

-- name: vector_load_since
SELECT vec_id, source_id, embedding, metadata, generation FROM vectors WHERE model = $1 AND generation > $2;

-- name: vector_source_indexed
UPDATE vector_sources SET indexed_version = (SELECT max(source_version) FROM vectors WHERE source_id = $1)
WHERE source_id = $1;

-- name: vector_source_external
-- An older version than the one recorded is ignored; a source marked gone comes back.
-- on duplicate PRIMARY
INSERT INTO vector_sources (source_id, kind, version, indexed_version, changed_at)
VALUES ($1, 'external', $2, (SELECT max(source_version) FROM vectors WHERE source_id = $1), $3);
-- otherwise
UPDATE vector_sources SET version = GREATEST($2, version), changed_at = $3, gone_at = NULL
WHERE source_id = $1 AND ($2 > version OR gone_at IS NOT NULL);

-- name: vector_source_memory
-- A memory as its last change left it: its version, and when it was forgotten or superseded (gone).
-- on duplicate PRIMARY
INSERT INTO vector_sources (source_id, kind, version, indexed_version, changed_at, gone_at)
VALUES ($1, 'memory', $2, (SELECT max(source_version) FROM vectors WHERE source_id = $1), $3, $4);
-- otherwise
UPDATE vector_sources SET version = $2, changed_at = $3, gone_at = $4 WHERE source_id = $1 AND $2 > version;

-- name: vector_source_gone
-- on duplicate PRIMARY
INSERT INTO vector_sources (source_id, kind, version, indexed_version, changed_at, gone_at)
VALUES ($1, 'external', 0, (SELECT max(source_version) FROM vectors WHERE source_id = $1), $2, $2);
-- otherwise
UPDATE vector_sources SET gone_at = $2 WHERE source_id = $1 AND gone_at IS NULL;

-- name: vector_source_delete
DELETE FROM vector_sources WHERE source_id = $1;

-- name: vector_cursor_get
SELECT at, id FROM vector_cursors WHERE name = $1;

-- name: vector_cursor_set
-- on duplicate PRIMARY
INSERT INTO vector_cursors (name, at, id) VALUES ($1, $2, $3);
-- otherwise
UPDATE vector_cursors SET at = $2, id = $3 WHERE name = $1 AND ($2, $3) > (at, id);

-- name: vector_memory_changes
-- Changes the sources table does not hold yet (a memory read before at its version is skipped here).
SELECT m.id, m.version, m.updated_at, m.deleted_at, m.superseded_by FROM memories m
LEFT JOIN vector_sources s ON s.source_id = m.id
WHERE (m.updated_at, m.id) > ($1, $2) AND (s.source_id IS NULL OR s.version < m.version)
ORDER BY m.updated_at, m.id LIMIT $3;

-- name: vector_memory_newest
SELECT updated_at, id FROM memories ORDER BY updated_at DESC, id DESC LIMIT 1;

-- name: vector_lagging
-- Read from the partial index vector_sources_lagging: sources up to date are never visited.
SELECT source_id, kind, version, indexed_version, changed_at FROM vector_sources
WHERE gone_at IS NULL AND (indexed_version IS NULL OR indexed_version < version)
  AND (changed_at, source_id) > ($1, $2)
ORDER BY changed_at, source_id LIMIT $3;

-- name: vector_lagging_count
SELECT count(*) AS n FROM vector_sources
WHERE gone_at IS NULL AND (indexed_version IS NULL OR indexed_version < version);
