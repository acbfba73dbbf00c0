"""Redis cache of Prefetch packets: key building and invalidation."""
