"""The write path.

Ingest (two writes, no model call), the outbox worker, the extraction pipeline it runs, and the
embedding reconciler.
"""
