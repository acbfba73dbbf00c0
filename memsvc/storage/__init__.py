"""PostgreSQL storage.

Migrations, the connection pool, the domain records and one repository per tier.
"""
