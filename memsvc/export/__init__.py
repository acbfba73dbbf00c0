"""ExportMemories: everything stored about a subject, as JSON lines (the user's right to data)."""
