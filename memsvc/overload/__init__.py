"""Overload: the process's load signals (event-loop lag, the machine's CPU, the queue in front
of the handlers), the rules that degrade or refuse a read on them, the read gate, and the log
of what was shed. Services receive the load as one object (:class:`Load`); the server holds
the read gate."""

from memsvc.overload.load import Load, LoadLimits

__all__ = ["Load", "LoadLimits"]
