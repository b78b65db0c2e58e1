"""The PostgreSQL dialect: the backend with failover, its URL target, schema and named queries (``*.sql``)."""
