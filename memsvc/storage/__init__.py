"""PostgreSQL storage: migrations, the connection pool and one repository per tier."""
