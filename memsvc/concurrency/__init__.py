"""asyncio primitives every layer shares.

Deadline budgets, leg fan-out, single flight, event-loop lag and retry backoff.
"""
