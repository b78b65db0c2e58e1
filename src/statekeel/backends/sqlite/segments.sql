-- Sealed segments (backends/sql/segments.py): only a dialect whose Tx keeps them defines these.

-- name: segment_seal
-- Pack messages [?2, ?2 + 256) into a sealed segment, only when all of them are there (a run a fork shares
-- with its parent, or one compression moved in part, is not: nothing is written). An existing segment for
-- the run stays: it holds the same rows.
INSERT OR IGNORE INTO message_segments (session_key, first_seq, upto_seq, payloads)
SELECT ?1, ?2, ?2 + 256, '[' || group_concat(payload, ',') || ']'
FROM (SELECT seq, payload FROM messages WHERE session_key = ?1 AND seq >= ?2 AND seq < ?2 + 256 ORDER BY seq)
HAVING count(*) = 256 AND min(seq) = ?2 AND max(seq) = ?2 + 255;

-- name: segment_firsts
SELECT first_seq FROM message_segments WHERE session_key = ?1 AND first_seq >= ?2 AND first_seq < ?3;

-- name: segment_range
-- The sealed segments inside [?2, ?3), in seq order.
SELECT first_seq, upto_seq, payloads FROM message_segments
WHERE session_key = ?1 AND first_seq >= ?2 AND upto_seq <= ?3 ORDER BY first_seq;
