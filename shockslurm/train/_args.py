"""argparse types of the helper's own benchmarks (`bench`, `restart_bench`): a bad value is a
usage error naming the option, not a traceback from deep in the run."""

from __future__ import annotations

import argparse
import os


def positive_int(text: str) -> int:
    """A whole number >= 1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def writable_dir(text: str) -> str:
    """An existing directory this process may create files in."""
    if not os.path.isdir(text):
        raise argparse.ArgumentTypeError(f"not a directory: {text!r}")
    if not os.access(text, os.W_OK | os.X_OK):
        raise argparse.ArgumentTypeError(f"not writable: {text!r}")
    return text
