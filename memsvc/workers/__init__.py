"""Durable background work: the outbox worker (extraction) and the embedding reconciler."""
