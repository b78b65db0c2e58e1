-- An episode names its messages by first_seq and upto_seq, seqs of the live transcript of the session's
-- rewind count when the episode was recorded: that count goes with it, so the pair names the same
-- messages forever (after a rewind the same seqs name others; see docs/branches.md). NULL: recorded
-- before episodes carried it, or the session is not held in this SQL store.
ALTER TABLE memory_episodes ADD COLUMN rewinds INTEGER CHECK (rewinds >= 0);
