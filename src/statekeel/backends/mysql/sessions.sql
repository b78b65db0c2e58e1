-- Sessions, messages and the message archive. Parameters are numbered ($1, $2 …) in the same order as
-- PostgreSQL's $1, $2 so both dialects take the same arguments.

-- name: session_get
SELECT `key`, status, metadata, last_consolidated, head_seq, version, created_at, updated_at, open_calls,
       calls_owner, write_id, parent_key, parent_seq, rewinds
FROM sessions WHERE `key` = $1;

-- name: session_get_for_update
SELECT `key`, status, metadata, last_consolidated, head_seq, version, created_at, updated_at, open_calls,
       calls_owner, write_id, parent_key, parent_seq, rewinds
FROM sessions WHERE `key` = $1 FOR UPDATE;

-- name: session_insert
-- on duplicate PRIMARY
INSERT INTO sessions (`key`, metadata, created_at, updated_at) VALUES ($1, $2, $3, $4)
RETURNING `key`, status, metadata, last_consolidated, head_seq, version, created_at, updated_at, open_calls,
       calls_owner, write_id, parent_key, parent_seq, rewinds;

-- name: session_insert_missing
-- A no-op update when the session exists: the exclusive row lock session_advance_head needs next, taken
-- at once (see lease_ensure).
INSERT INTO sessions (`key`, metadata, created_at, updated_at) VALUES ($1, $2, $3, $4)
ON DUPLICATE KEY UPDATE `key` = `key`;

-- name: session_list
SELECT `key`, status, metadata, last_consolidated, head_seq, version, created_at, updated_at, open_calls,
       calls_owner, write_id, parent_key, parent_seq, rewinds
FROM sessions ORDER BY updated_at DESC, `key` DESC LIMIT $1;

-- name: session_list_after
SELECT `key`, status, metadata, last_consolidated, head_seq, version, created_at, updated_at, open_calls,
       calls_owner, write_id, parent_key, parent_seq, rewinds
FROM sessions WHERE (updated_at, `key`) < ($1, $2) ORDER BY updated_at DESC, `key` DESC LIMIT $3;

-- name: session_list_status
SELECT `key`, status, metadata, last_consolidated, head_seq, version, created_at, updated_at, open_calls,
       calls_owner, write_id, parent_key, parent_seq, rewinds
FROM sessions WHERE status = $1 ORDER BY updated_at DESC, `key` DESC LIMIT $2;

-- name: session_list_status_after
SELECT `key`, status, metadata, last_consolidated, head_seq, version, created_at, updated_at, open_calls,
       calls_owner, write_id, parent_key, parent_seq, rewinds
FROM sessions WHERE status = $1 AND (updated_at, `key`) < ($2, $3)
ORDER BY updated_at DESC, `key` DESC LIMIT $4;

-- name: session_update
UPDATE sessions
SET metadata = COALESCE($1, metadata), status = COALESCE($2, status), version = version + 1,
    updated_at = $3
WHERE `key` = $4 AND ($5 IS NULL OR version = $5);
SELECT `key`, status, metadata, last_consolidated, head_seq, version, created_at, updated_at, open_calls,
       calls_owner, write_id, parent_key, parent_seq, rewinds FROM sessions WHERE `key` = $4;

-- name: session_delete
DELETE FROM sessions WHERE `key` = $1;

-- name: session_advance_head
UPDATE sessions
SET head_seq = head_seq + $1, metadata = COALESCE($2, metadata),
    status = COALESCE($6, status), version = version + 1, updated_at = $3,
    -- A writer that reads the transcript says how many tool calls wait for a result and whose they are;
    -- one that does not ($9 NULL) makes the count unknown when it appends messages.
    open_calls = CASE WHEN $9 IS NOT NULL THEN $9 WHEN $1 > 0 THEN -1 ELSE open_calls END,
    calls_owner = CASE WHEN $9 IS NOT NULL THEN $10 ELSE calls_owner END,
    -- Which save this is, so that one whose answer was lost knows its own write (NULL: none given).
    write_id = $11
WHERE `key` = $4 AND head_seq = $5 AND ($7 IS NULL OR created_at = $7)
  -- A save made before a rewind conflicts even at the same head.
  AND ($12 IS NULL OR rewinds = $12)
  AND ($8 IS NULL OR version = $8);
SELECT `key`, status, metadata, last_consolidated, head_seq, version, created_at, updated_at, open_calls,
       calls_owner, write_id, parent_key, parent_seq, rewinds FROM sessions WHERE `key` = $4;

-- name: session_set_consolidated
UPDATE sessions SET last_consolidated = $1, version = version + 1, updated_at = $2
WHERE `key` = $3 AND last_consolidated = $4;
SELECT `key`, status, metadata, last_consolidated, head_seq, version, created_at, updated_at, open_calls,
       calls_owner, write_id, parent_key, parent_seq, rewinds FROM sessions WHERE `key` = $3;

-- name: message_insert
INSERT INTO messages (session_key, seq, role, payload, created_at, `usage`) VALUES ($1, $2, $3, $4, $5, $6);

-- name: message_range
SELECT seq, role, payload, created_at FROM messages
WHERE session_key = $1 AND seq >= $2 AND seq < $3 ORDER BY seq;

-- name: message_range_open
SELECT seq, role, payload, created_at FROM messages
WHERE session_key = $1 AND seq >= $2 ORDER BY seq;

-- name: message_tail
SELECT seq, role, payload, created_at FROM messages
WHERE session_key = $1 ORDER BY seq DESC LIMIT $2;

-- name: message_delete_range
DELETE FROM messages WHERE session_key = $1 AND seq >= $2 AND seq < $3;

-- name: compression_insert
INSERT INTO compressions (session_key, compression_id, first_seq, upto_seq, summary, created_at)
VALUES ($1, $2, $3, $4, $5, $6);

-- name: archive_copy
INSERT INTO message_archive (session_key, compression_id, seq, role, payload, created_at, `usage`)
SELECT session_key, $1, seq, role, payload, created_at, `usage` FROM messages
WHERE session_key = $2 AND seq >= $3 AND seq < $4;

-- name: archive_all
SELECT a.compression_id, a.seq, a.payload, c.summary, a.created_at
FROM message_archive a JOIN compressions c USING (session_key, compression_id)
WHERE a.session_key = $1 ORDER BY a.seq;

-- name: archive_one
SELECT a.compression_id, a.seq, a.payload, c.summary, a.created_at
FROM message_archive a JOIN compressions c USING (session_key, compression_id)
WHERE a.session_key = $1 AND a.compression_id = $2 ORDER BY a.seq;

-- name: compression_list
SELECT compression_id, first_seq, upto_seq, summary FROM compressions
WHERE session_key = $1 AND kind = 'compression' ORDER BY first_seq;

-- name: session_transition_idle
-- updated_at is kept: a status change by retention is not activity.
UPDATE sessions SET status = $1, version = version + 1
WHERE status = $2 AND updated_at < $3;

-- name: archive_as_messages
SELECT seq, role, payload, created_at FROM message_archive WHERE session_key = $1 ORDER BY seq;

-- name: message_payload_array
-- The live history as one JSON array (the payloads' JSON text joined); the caller checks count and
-- bounds for density.
SELECT CONCAT('[', COALESCE(GROUP_CONCAT(payload ORDER BY seq SEPARATOR ','), ''), ']') AS arr, count(*) AS n,
       min(seq) AS lo, max(seq) AS hi
FROM messages WHERE session_key = $1 AND seq >= $2;

-- name: archive_payload_array
SELECT CONCAT('[', COALESCE(GROUP_CONCAT(payload ORDER BY seq SEPARATOR ','), ''), ']') AS arr, count(*) AS n,
       min(seq) AS lo, max(seq) AS hi
FROM message_archive WHERE session_key = $1;


-- name: session_steps_inherit
-- A fork inherits the journal rows of the calls whose result is not in what it inherited (started, failed,
-- or answered at or after the fork point $3): a call that ran in the parent is in doubt in the fork,
-- never answered as not run nor run again through it.
INSERT INTO session_steps (session_key, call_id, status, attempt, owner, result_seq, error, started_at,
                           finished_at)
SELECT $1, call_id, status, attempt, owner, result_seq, error, started_at, finished_at
FROM session_steps
WHERE session_key = $2 AND status <> 'interrupted' AND (result_seq IS NULL OR result_seq >= $3);

-- name: session_insert_fork
-- A fork: its row only (nothing is copied); its head starts at the fork point. What it inherited may end
-- with tool calls waiting for a result: their count is unknown (-1) until counted, and their owner is the
-- process that made the fork ($6), so that they are answered once it is gone.
-- on duplicate PRIMARY
INSERT INTO sessions (`key`, metadata, head_seq, parent_key, parent_seq, created_at, updated_at, open_calls,
                      calls_owner)
VALUES ($1, $2, $4, $3, $4, $5, $5, CASE WHEN $4 > 0 THEN -1 ELSE 0 END,
        CASE WHEN $4 > 0 THEN $6 END)
RETURNING `key`, status, metadata, last_consolidated, head_seq, version, created_at, updated_at, open_calls,
       calls_owner, write_id, parent_key, parent_seq, rewinds;

-- name: session_chain
-- The ancestors a fork reads, oldest first: each one's part of the history is [lo, hi) (its own messages
-- from its own fork point, up to where its child forked). $1, $2: the fork's parent_key and parent_seq.
WITH RECURSIVE chain (`key`, lo, hi, parent_key, depth, last_consolidated) AS (
    SELECT `key`, LEAST(COALESCE(parent_seq, 0), CAST($2 AS SIGNED)), CAST($2 AS SIGNED), parent_key, 0,
           last_consolidated
    FROM sessions WHERE `key` = $1
    UNION ALL
    SELECT s.`key`, LEAST(COALESCE(s.parent_seq, 0), c.lo), c.lo, s.parent_key, c.depth + 1, s.last_consolidated
    FROM sessions s JOIN chain c ON s.`key` = c.parent_key
)
SELECT `key`, lo, hi, last_consolidated FROM chain ORDER BY depth DESC;

-- name: session_children
-- The forks made directly from a session, by fork point then key.
SELECT `key`, parent_seq, last_consolidated, head_seq, created_at FROM sessions
WHERE parent_key = $1 ORDER BY parent_seq, `key`;

-- name: session_children_for_update
-- Locked: a fork cannot be compressed or reparented while its parent's part is copied into it.
SELECT `key`, parent_seq, last_consolidated FROM sessions WHERE parent_key = $1 ORDER BY `key` FOR UPDATE;

-- name: session_reparent
-- A fork whose parent goes: it now holds that parent's part itself and reads the rest from its grandparent.
UPDATE sessions SET parent_key = $2, parent_seq = $3 WHERE `key` = $1 AND parent_key = $4;

-- name: view_payload_array
-- One ancestor's part [$2, $3) of a fork's history, live or archived, as one JSON array.
SELECT CONCAT('[', COALESCE(GROUP_CONCAT(payload ORDER BY seq SEPARATOR ','), ''), ']') AS arr, count(*) AS n,
       min(seq) AS lo, max(seq) AS hi
FROM (SELECT seq, payload FROM messages WHERE session_key = $1 AND seq >= $2 AND seq < $3
      UNION ALL
      SELECT seq, payload FROM message_archive WHERE session_key = $1 AND seq >= $2 AND seq < $3) AS part;

-- name: view_rows
-- One ancestor's part [$2, $3) of a fork's history, live or archived, row by row.
SELECT seq, role, payload, created_at, `usage` FROM messages WHERE session_key = $1 AND seq >= $2 AND seq < $3
UNION ALL
SELECT seq, role, payload, created_at, `usage` FROM message_archive
WHERE session_key = $1 AND seq >= $2 AND seq < $3
ORDER BY seq;

-- name: archive_insert
INSERT INTO message_archive (session_key, compression_id, seq, role, payload, created_at, `usage`)
VALUES ($1, $2, $3, $4, $5, $6, $7);

-- name: session_rewind
-- The live transcript ends at $1 again; a fork's own part starts there at the latest. A save made before
-- the rewind conflicts (rewinds + 1); the waiting calls are counted again (-1: unknown), owned by the
-- process that rewound ($5) until it is gone. (MariaDB assigns left to right: parent_seq comes before
-- anything it reads is changed.)
UPDATE sessions
SET parent_seq = CASE WHEN parent_key IS NULL THEN NULL ELSE LEAST(parent_seq, $1) END, head_seq = $1,
    rewinds = rewinds + 1, version = version + 1, updated_at = $2, open_calls = -1, calls_owner = $5,
    write_id = NULL
WHERE `key` = $3 AND head_seq = $4;
SELECT `key`, status, metadata, last_consolidated, head_seq, version, created_at, updated_at, open_calls,
       calls_owner, write_id, parent_key, parent_seq, rewinds FROM sessions WHERE `key` = $3;

-- name: session_cut_fork
-- A fork of a rewound session: it now holds the part past the rewind point itself.
UPDATE sessions SET parent_seq = $2 WHERE `key` = $1 AND parent_key = $3;

-- name: rewind_insert
INSERT INTO compressions (session_key, compression_id, first_seq, upto_seq, summary, created_at, kind)
VALUES ($1, $2, $3, $4, $5, $6, 'rewind');

-- name: rewound_copy
INSERT INTO rewound_messages (session_key, compression_id, seq, role, payload, created_at, `usage`)
SELECT session_key, $1, seq, role, payload, created_at, `usage` FROM messages
WHERE session_key = $2 AND seq >= $3 AND seq < $4;

-- name: rewound_insert
INSERT INTO rewound_messages (session_key, compression_id, seq, role, payload, created_at, `usage`)
VALUES ($1, $2, $3, $4, $5, $6, $7);

-- name: rewound_one
SELECT r.compression_id, r.seq, r.payload, c.summary, r.created_at
FROM rewound_messages r JOIN compressions c USING (session_key, compression_id)
WHERE r.session_key = $1 AND r.compression_id = $2 ORDER BY r.seq;

-- name: compression_kind
SELECT kind FROM compressions WHERE session_key = $1 AND compression_id = $2;

-- name: usage_rows
-- The usages recorded with a session's messages [$2, $3), live or archived (rewound ones are not).
SELECT seq, `usage` FROM messages
WHERE session_key = $1 AND seq >= $2 AND seq < $3 AND `usage` IS NOT NULL
UNION ALL
SELECT seq, `usage` FROM message_archive
WHERE session_key = $1 AND seq >= $2 AND seq < $3 AND `usage` IS NOT NULL;

-- name: message_payload_range
-- Live messages [$2, $3) as one JSON array (an ancestor's part of a fork's history, none of it archived).
SELECT CONCAT('[', COALESCE(GROUP_CONCAT(payload ORDER BY seq SEPARATOR ','), ''), ']') AS arr, count(*) AS n,
       min(seq) AS lo, max(seq) AS hi
FROM messages WHERE session_key = $1 AND seq >= $2 AND seq < $3;

-- name: rewind_list
SELECT compression_id, first_seq, upto_seq, summary, created_at FROM compressions
WHERE session_key = $1 AND kind = 'rewind' ORDER BY created_at, compression_id;
