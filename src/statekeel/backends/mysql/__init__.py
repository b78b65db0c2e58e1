"""The MySQL / MariaDB dialect: the backend, its query compiler, schema and named queries (``*.sql``)."""
