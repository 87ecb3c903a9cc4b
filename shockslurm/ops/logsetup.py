"""The daemon's logging: `text` or `json` lines on one stream, URL passwords masked everywhere.

A record may carry structured fields in `record.fields` (a dict, passed as
`extra={"fields": {...}}`): the JSON format emits them as top-level keys; the text format
shows only the message (which the caller writes to contain them).

The handler sits on the root logger, so every library's records and Python's warnings
(`logging.captureWarnings`) come out in the same format: in `json` mode every line is a JSON
object. Under journald (`journald = "yes"`, or `"auto"` with `$JOURNAL_STREAM` set, as systemd
sets it for a unit's output) lines carry no timestamp of their own (the journal has one) and each
starts with its syslog priority, `<3>` error (`<2>` critical), `<4>` warning, `<6>` info, `<7>`
debug, which journald strips and stores: `journalctl -u shockslurm -p err` shows the errors.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time
from typing import IO, Any, Mapping

from ..errors import printable
from ..masking import mask

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
    """One line a record: the message's newlines and other unprintable characters (a Slurm
    command's multi-line stderr, a terminal escape) escaped, so no part of it passes for a
    record of its own; a traceback follows on lines of its own."""

    def __init__(self, timestamp: bool = True) -> None:
        super().__init__(("%(asctime)s " if timestamp else "")
                         + "shockslurm %(levelname)s %(name)s: %(message)s")

    def formatMessage(self, record: logging.LogRecord) -> str:
        return printable(super().formatMessage(record))


def syslog_priority(levelno: int) -> int:
    """The syslog priority of a logging level (RFC 5424: 2 crit, 3 err, 4 warning, 6 info,
    7 debug)."""
    if levelno >= logging.CRITICAL:
        return 2
    if levelno >= logging.ERROR:
        return 3
    if levelno >= logging.WARNING:
        return 4
    return 6 if levelno >= logging.INFO else 7


class JournalFormatter(logging.Formatter):
    """Another formatter's output with every line prefixed `<priority>` (journald reads the
    prefix of each line it receives, so a traceback's lines keep the record's priority)."""

    def __init__(self, inner: logging.Formatter) -> None:
        super().__init__()
        self.inner = inner

    def format(self, record: logging.LogRecord) -> str:
        prefix = f"<{syslog_priority(record.levelno)}>"
        return "\n".join(prefix + line for line in self.inner.format(record).splitlines())


def under_journald(journald: str, env: Mapping[str, str] | None = None) -> bool:
    """`journald`: yes | no | auto (`$JOURNAL_STREAM` set: systemd connected the output to the
    journal)."""
    if journald == "auto":
        return bool((os.environ if env is None else env).get("JOURNAL_STREAM"))
    return journald == "yes"


def make_formatter(log_format: str, journal: bool) -> logging.Formatter:
    """The formatter of `log_format` (text | json), for journald when `journal`."""
    if log_format == "json":
        fmt: logging.Formatter = JsonFormatter()
    else:
        fmt = TextFormatter(timestamp=not journal)
    return JournalFormatter(fmt) if journal else fmt


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


def daemon_level(requested: int) -> int:
    """The daemon's level for its `shockslurm` loggers: INFO (the round line is its heartbeat),
    or lower where the global `--log-level` (`requested`, the root logger's level; 0 when unset)
    asks for more, e.g. DEBUG for each Shockwave re-solve's inputs per job."""
    return min(logging.INFO, requested or logging.INFO)


def configure(log_format: str, stream: IO[str] | None = None, level: int = logging.INFO,
              journald: str = "auto") -> logging.Handler:
    """Install (or switch the format of) the daemon's handler on the root logger: the
    `shockslurm` loggers at `level`, every other logger and Python's warnings at WARNING, all in
    one format on one stream (plain stream handlers on the root, e.g. `--log-level`'s, are
    taken off).
    Idempotent: SIGHUP calls it again with the new format."""
    root = logging.getLogger()
    handler = next((h for h in root.handlers if h.get_name() == _HANDLER_NAME), None)
    if handler is None:
        handler = logging.StreamHandler(stream or sys.stderr)
        handler.set_name(_HANDLER_NAME)
        handler.addFilter(MaskingFilter())
        for other in [h for h in root.handlers if type(h) is logging.StreamHandler]:
            root.removeHandler(other)      # basicConfig's (--log-level); not a test's capture
        root.addHandler(handler)
    elif stream is not None and isinstance(handler, logging.StreamHandler):
        handler.setStream(stream)
    handler.setFormatter(make_formatter(log_format, under_journald(journald)))
    root.setLevel(logging.WARNING)
    logger = logging.getLogger(LOGGER)
    logger.setLevel(min(level, logger.level or level))
    logger.propagate = True
    logging.captureWarnings(True)
    return handler


def remove() -> None:
    """Take the daemon's handler off again (tests, in-process runs)."""
    root = logging.getLogger()
    for h in [h for h in root.handlers if h.get_name() == _HANDLER_NAME]:
        root.removeHandler(h)
    logging.captureWarnings(False)
