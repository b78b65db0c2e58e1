-- Sealed segments (SQLite's 0016) are kept by SQLite alone: a load here is one statement, whose cost is
-- the round trip, not the rows. This migration keeps the schema versions of the dialects in step, so an
-- export names one version for every backend.
SELECT 1;
