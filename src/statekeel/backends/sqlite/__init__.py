"""The SQLite dialect: the backend, its writer thread, schema, damage reading and ``*.sql`` queries."""
