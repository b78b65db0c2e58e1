-- PostgreSQL installs a function that takes the audit chain's lock and reads its head in one call. SQLite
-- needs nothing: its single writer already serializes appends. The number is kept so that every dialect's
-- schema has the same version.
SELECT 1;
