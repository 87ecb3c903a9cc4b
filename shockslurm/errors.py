"""Errors that carry the place of the bad input, so users can fix it without guessing."""

from __future__ import annotations


class ShockslurmError(Exception):
    """Base class of every error this package raises on purpose."""


class InputError(ShockslurmError, ValueError):
    """Bad user input: names the file, the line (1-based) and the field where it was found."""

    def __init__(self, message: str, *, source: str | None = None, line: int | None = None,
                 field: str | None = None) -> None:
        self.message = message
        self.source = source
        self.line = line
        self.field = field
        super().__init__(str(self))

    def __str__(self) -> str:
        where = []
        if self.source is not None:
            where.append(str(self.source))
        if self.line is not None:
            where.append(f"line {self.line}")
        if self.field is not None:
            where.append(f"field '{self.field}'")
        return f"{', '.join(where)}: {self.message}" if where else self.message


class ConfigError(InputError):
    """A configuration value that cannot be used; `field` names the key."""


def is_utf8(text: str) -> bool:
    """Whether `text` encodes as UTF-8: bytes from a non-UTF-8 command line arrive
    surrogate-escaped (PEP 383) and fail only when written to a file, a store or a command."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def raw_text(value: str, limit: int = 60) -> str:
    """`value` as the bytes the user typed where it came from a command line ('\\xff'), else
    its `ascii` form; at most `limit` characters, so a long argument cannot flood a message."""
    try:
        shown = repr(value.encode("utf-8", "surrogateescape"))[2:-1]    # b'\xff' -> \xff
    except UnicodeEncodeError:      # a lone surrogate no command line produces
        shown = ascii(value)[1:-1]
    return shown if len(shown) <= limit else shown[:limit - 3] + "..."


def printable(text: str) -> str:
    """`text` for a terminal: each character that is not printable (a newline, NUL, a terminal
    escape, a right-to-left override) as its escape (`\\n`, `\\x00`, `\\u202e`), so a value from
    a job (its name, a report's detail) cannot forge a line or a column of a table."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else ascii(c)[1:-1] for c in text)
