"""Passwords hidden from what is shown: log lines, error messages, `config check`'s output, the
run configuration the store keeps. One rule for the daemon's configuration and the store's URLs
(`store.database`), so neither shows a password the other would hide."""

from __future__ import annotations

import re

_URL_PASSWORD = re.compile(r"(\b[A-Za-z][A-Za-z0-9+.\-]*://[^:/@\r\n]*:)[^@\r\n]+@")
_QUERY_PASSWORD = re.compile(r"(?i)(password=)[^&\s#\"']+")


def mask(text: str) -> str:
    """Hide passwords anywhere in `text`: a URL's (`scheme://user:***@host/db`, the password
    may hold spaces but not a line break) and a `password=` parameter's (`?password=***`, any
    case; the value ends at `&`, whitespace, `#` or a quote)."""
    return _QUERY_PASSWORD.sub(r"\1***", _URL_PASSWORD.sub(r"\1***@", text))
