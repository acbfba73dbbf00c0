"""The online half of the write path: Ingest (two writes, no model call) and its status."""
