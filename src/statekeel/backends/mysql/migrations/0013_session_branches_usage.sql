-- Branches: a fork is a session whose history is its parent's messages 0..parent_seq-1 followed by its
-- own (stored under its own key from parent_seq on); nothing is copied when it is made. Both NULL for a
-- session that is no fork. A parent is never deleted from under its forks: its delete first copies the
-- part of its history a fork reads into that fork (see docs/branches.md).

ALTER TABLE sessions ADD COLUMN IF NOT EXISTS parent_key VARCHAR(512);
ALTER TABLE sessions ADD COLUMN IF NOT EXISTS parent_seq BIGINT CHECK (parent_seq >= 0);
CREATE INDEX IF NOT EXISTS sessions_by_parent ON sessions (parent_key, parent_seq);

-- Rewinds: the tail a rewind took out of the live transcript, kept under a rewind record (a compressions
-- row of kind 'rewind', its summary the reason). Kept apart from message_archive, which holds the
-- compressed prefix of the history: the live view reuses a rewound seq for the message appended there.
ALTER TABLE compressions ADD COLUMN IF NOT EXISTS kind VARCHAR(16) NOT NULL DEFAULT 'compression'
    CHECK (kind IN ('compression', 'rewind'));
CREATE TABLE IF NOT EXISTS rewound_messages (
    session_key    VARCHAR(512) NOT NULL,
    compression_id VARCHAR(64) NOT NULL,
    seq            BIGINT NOT NULL,
    role           VARCHAR(64) NOT NULL,
    payload        LONGTEXT NOT NULL,
    created_at     DATETIME(6) NOT NULL,
    `usage`        LONGTEXT,
    PRIMARY KEY (session_key, compression_id, seq),
    CONSTRAINT rewound_messages_compression FOREIGN KEY (session_key, compression_id)
        REFERENCES compressions (session_key, compression_id) ON DELETE CASCADE
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;
-- How many rewinds the session had: a save made before one conflicts, even at the same head.
ALTER TABLE sessions ADD COLUMN IF NOT EXISTS rewinds BIGINT NOT NULL DEFAULT 0;

-- Usage: what the turn that produced a message cost (model, tokens, cost), stored with it (NULL: none).
ALTER TABLE messages ADD COLUMN IF NOT EXISTS `usage` LONGTEXT;
ALTER TABLE message_archive ADD COLUMN IF NOT EXISTS `usage` LONGTEXT;
