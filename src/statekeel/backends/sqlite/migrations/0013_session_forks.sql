-- Branches: a fork is a session whose history is its parent's messages 0..parent_seq-1 followed by its
-- own (stored under its own key from parent_seq on); nothing is copied when it is made. Both NULL for a
-- session that is no fork. A parent is never deleted from under its forks: its delete first copies the
-- part of its history a fork reads into that fork (see docs/branches.md).

ALTER TABLE sessions ADD COLUMN parent_key TEXT;
ALTER TABLE sessions ADD COLUMN parent_seq INTEGER CHECK (parent_seq >= 0);
CREATE INDEX sessions_by_parent ON sessions (parent_key, parent_seq) WHERE parent_key IS NOT NULL;
