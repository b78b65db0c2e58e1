-- PostgreSQL installs a function that takes the audit chain's lock and reads its head in one call. Here the
-- named query is a script of the same two statements (the lock row, then the head). The number is kept so
-- that every dialect's schema has the same version.
SELECT 1;
