"""Prefetch: the session-start context packet, assembled hierarchically and cached in Redis."""
