"""The persistence hook between the group coordinator and the offsets log (helper-notes contract)."""

from __future__ import annotations


class PersistError(Exception):
    """Records could not be appended (and flushed per ``rallypoint.offsets.flush``)."""
