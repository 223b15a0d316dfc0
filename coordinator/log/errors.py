"""Errors that stop the broker before it listens (the CLI prints them and exits 1)."""

from __future__ import annotations


class OffsetsLogStartError(Exception):
    """The offsets log cannot be opened safely."""
