"""Log lines: text for people (the default) or one JSON object per line, with the call's ids.

Both formats render an exception as its class and stack frames only, never its message: a
driver's message can quote the row it failed on (asyncpg's DETAIL does), and memory content
or a key must never reach a log. The frames are enough to find the bug.
"""

from __future__ import annotations

import logging
import sys
import traceback
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from types import TracebackType

import orjson

from memsvc.observability import call_context

CONTEXT_FIELDS = ("request_id", "rpc", "tenant")
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s %(message)s"
MAX_CAUSES = 4

ExcInfo = tuple[type[BaseException], BaseException, TracebackType | None]


class ContextFilter(logging.Filter):
    """Stamps each record with the current call's ids, in the context of the logging call."""

    def filter(self, record: logging.LogRecord) -> bool:
        record.request_id = call_context.request_id.get()
        record.rpc = call_context.rpc.get()
        record.tenant = call_context.tenant.get()
        return True


def _context(record: logging.LogRecord) -> dict[str, str]:
    found = {}
    for name in CONTEXT_FIELDS:
        value = getattr(record, name, None)
        if isinstance(value, str):
            found[name] = value
    return found


@dataclass(frozen=True)
class ExceptionSummary:
    """What a log line says about an exception: classes and frames, no message."""

    type: str
    caused_by: tuple[str, ...]
    frames: tuple[str, ...]

    @classmethod
    def of(cls, exc_info: ExcInfo) -> ExceptionSummary:
        exc_type, exc, tb = exc_info
        chain = [f"{exc_type.__module__}.{exc_type.__qualname__}"]
        cause = exc.__cause__ or exc.__context__
        while cause is not None and len(chain) < MAX_CAUSES + 1:
            chain.append(f"{type(cause).__module__}.{type(cause).__qualname__}")
            cause = cause.__cause__ or cause.__context__
        frames = tuple(f"{f.filename}:{f.lineno} in {f.name}" for f in traceback.extract_tb(tb))
        return cls(chain[0], tuple(chain[1:]), frames)


def _exc_info(record: logging.LogRecord) -> ExcInfo | None:
    info = record.exc_info
    # Not always a tuple: asyncio's default exception handler logs exc_info=False when it
    # has no exception, and logging keeps that False on the record.
    if not info or info[0] is None or info[1] is None:
        return None
    return (info[0], info[1], info[2])


class JsonFormatter(logging.Formatter):
    """One JSON object per line: ts, level, logger, msg, and request_id/rpc/tenant when known."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, object] = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "msg": record.getMessage(),
            **_context(record),
        }
        info = _exc_info(record)
        if info is not None:
            entry["exc"] = asdict(ExceptionSummary.of(info))
        return orjson.dumps(entry).decode()


class TextFormatter(logging.Formatter):
    """The classic line, the call's ids appended in brackets, exceptions without messages."""

    def __init__(self) -> None:
        super().__init__(TEXT_FORMAT)

    def format(self, record: logging.LogRecord) -> str:
        # The base class would print (and cache on the record) the full traceback text.
        saved = record.exc_info, record.exc_text
        record.exc_info, record.exc_text = None, None
        try:
            line = super().format(record)
        finally:
            record.exc_info, record.exc_text = saved
        ids = _context(record)
        if ids:
            line += " [" + " ".join(f"{k}={v}" for k, v in ids.items()) + "]"
        info = _exc_info(record)
        if info is not None:
            summary = ExceptionSummary.of(info)
            causes = "".join(f" (caused by {c})" for c in summary.caused_by)
            frames = "".join(f"\n    {f}" for f in summary.frames)
            line += f"\n  {summary.type}{causes}{frames}"
        return line


def configure(level: str, log_format: str) -> None:
    """Send every logger's records to stderr in ``log_format`` ("text" or "json")."""
    handler = logging.StreamHandler(sys.stderr)
    handler.addFilter(ContextFilter())
    handler.setFormatter(JsonFormatter() if log_format == "json" else TextFormatter())
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level.upper())
