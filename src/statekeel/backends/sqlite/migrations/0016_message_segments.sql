-- Sealed segments: a run of SEGMENT (256) messages of one session, older than the live tail, packed into
-- one row as the JSON array of their stored payloads (each still sealed under its key when the store is
-- encrypted), written in the transaction of the append that sealed it. The rows in `messages` stay the
-- truth: a load reads the segments and the rows they do not cover, every other reader reads rows.
CREATE TABLE message_segments (
    session_key TEXT NOT NULL REFERENCES sessions (key) ON DELETE CASCADE,
    first_seq   INTEGER NOT NULL CHECK (first_seq >= 0 AND first_seq % 256 = 0),
    upto_seq    INTEGER NOT NULL CHECK (upto_seq = first_seq + 256),
    payloads    TEXT NOT NULL,
    PRIMARY KEY (session_key, first_seq)
);

-- A segment is a copy of its rows: whatever deletes or changes one of them (compression, a rewind, a key
-- rotation, erasure, a purge, a repair) drops the segment that covers it, in the same statement.
CREATE TRIGGER message_segments_on_delete AFTER DELETE ON messages
BEGIN
    DELETE FROM message_segments
    WHERE session_key = OLD.session_key AND first_seq = OLD.seq - OLD.seq % 256;
END;

CREATE TRIGGER message_segments_on_update AFTER UPDATE ON messages
BEGIN
    DELETE FROM message_segments
    WHERE session_key = OLD.session_key AND first_seq = OLD.seq - OLD.seq % 256;
    DELETE FROM message_segments
    WHERE session_key = NEW.session_key AND first_seq = NEW.seq - NEW.seq % 256;
END;
