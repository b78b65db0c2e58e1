-- Branches: a fork is a session whose history is its parent's messages 0..parent_seq-1 followed by its
-- own (stored under its own key from parent_seq on); nothing is copied when it is made. Both NULL for a
-- session that is no fork. A parent is never deleted from under its forks: its delete first copies the
-- part of its history a fork reads into that fork (see docs/branches.md).

ALTER TABLE sessions ADD COLUMN parent_key TEXT;
ALTER TABLE sessions ADD COLUMN parent_seq INTEGER CHECK (parent_seq >= 0);
CREATE INDEX sessions_by_parent ON sessions (parent_key, parent_seq) WHERE parent_key IS NOT NULL;

-- Rewinds: the tail a rewind took out of the live transcript, kept under a rewind record (a compressions
-- row of kind 'rewind', its summary the reason). Kept apart from message_archive, which holds the
-- compressed prefix of the history: the live view reuses a rewound seq for the message appended there.
ALTER TABLE compressions ADD COLUMN kind TEXT NOT NULL DEFAULT 'compression'
    CHECK (kind IN ('compression', 'rewind'));
CREATE TABLE rewound_messages (
    session_key    TEXT NOT NULL,
    compression_id TEXT NOT NULL,
    seq            INTEGER NOT NULL,
    role           TEXT NOT NULL,
    payload        TEXT NOT NULL,
    created_at     INTEGER NOT NULL,
    usage          TEXT,
    PRIMARY KEY (session_key, compression_id, seq),
    FOREIGN KEY (session_key, compression_id) REFERENCES compressions (session_key, compression_id)
        ON DELETE CASCADE
) WITHOUT ROWID;
-- How many rewinds the session had: a save made before one conflicts, even at the same head.
ALTER TABLE sessions ADD COLUMN rewinds INTEGER NOT NULL DEFAULT 0;

-- Usage: what the turn that produced a message cost (model, tokens, cost), stored with it (NULL: none).
ALTER TABLE messages ADD COLUMN usage TEXT;
ALTER TABLE message_archive ADD COLUMN usage TEXT;
