"""The daemon's logging: `text` or `json` lines on one stream, URL passwords masked everywhere.

A record may carry structured fields in `record.fields` (a dict, passed as
`extra={"fields": {...}}`): the JSON format emits them as top-level keys; the text format
shows only the message (which the caller writes to contain them).
"""

from __future__ import annotations

import json
import logging
import sys
import time
from typing import IO, Any

from .config import mask

LOGGER = "shockslurm"
_HANDLER_NAME = "shockslurm-daemon"


class MaskingFilter(logging.Filter):
    """Rewrites each record's message with URL passwords hidden (`user:***@host`)."""

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            message = record.getMessage()
        except Exception:  # a malformed record: leave it to the formatter
            return True
        masked = mask(message)
        if masked != message or record.args:
            record.msg, record.args = masked, None
        return True


class TextFormatter(logging.Formatter):
    def __init__(self) -> None:
        super().__init__("%(asctime)s shockslurm %(levelname)s %(name)s: %(message)s")


class JsonFormatter(logging.Formatter):
    """One JSON object per line: ts, level, logger, msg, then the record's `fields`."""

    def format(self, record: logging.LogRecord) -> str:
        obj: dict[str, Any] = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname, "logger": record.name, "msg": mask(record.getMessage())}
        fields = getattr(record, "fields", None)
        if isinstance(fields, dict):
            for k, v in fields.items():
                obj.setdefault(k, v)
        if record.exc_info:
            obj["exc"] = mask(self.formatException(record.exc_info))
        return json.dumps(obj, default=str)


def configure(log_format: str, stream: IO[str] | None = None,
              level: int = logging.INFO) -> logging.Handler:
    """Install (or switch the format of) the daemon's handler on the `shockslurm` logger.
    Idempotent: SIGHUP calls it again with the new format."""
    logger = logging.getLogger(LOGGER)
    handler = next((h for h in logger.handlers if h.get_name() == _HANDLER_NAME), None)
    if handler is None:
        handler = logging.StreamHandler(stream or sys.stderr)
        handler.set_name(_HANDLER_NAME)
        handler.addFilter(MaskingFilter())
        logger.addHandler(handler)
    elif stream is not None and isinstance(handler, logging.StreamHandler):
        handler.setStream(stream)
    handler.setFormatter(JsonFormatter() if log_format == "json" else TextFormatter())
    logger.setLevel(min(level, logger.level or level))
    logger.propagate = False   # the root handler (--log-level) would print every line twice
    return handler


def remove() -> None:
    """Take the daemon's handler off again (tests, in-process runs)."""
    logger = logging.getLogger(LOGGER)
    for h in [h for h in logger.handlers if h.get_name() == _HANDLER_NAME]:
        logger.removeHandler(h)
    logger.propagate = True
