"""Errors shared by parsers, the store and the service layer.

Each names what was wrong and where, so a user can fix the input without reading code. They are pure
(no I/O) so that ``ingest`` and ``analyzers`` may raise them.
"""

from __future__ import annotations


class FleetscopeError(Exception):
    """Base of every error Fleetscope raises on purpose."""


class ParseError(FleetscopeError, ValueError):
    """Input that a parser cannot read: names the source, the line (1-based) and the field where known."""

    def __init__(self, message: str, *, source: str = "", line: int | None = None, field: str | None = None):
        self.message = message
        self.source = source
        self.line = line
        self.field = field
        where = ", ".join(
            p for p in (source or None, f"line {line}" if line is not None else None, f"field {field!r}" if field else None) if p
        )
        super().__init__(f"{where}: {message}" if where else message)


class ValidationError(FleetscopeError, ValueError):
    """A batch that does not fit its canonical frame: names the frame, the row (0-based) and the field."""

    def __init__(self, message: str, *, frame: str, row: int | None = None, field: str | None = None):
        self.message = message
        self.frame = frame
        self.row = row
        self.field = field
        where = frame
        if row is not None:
            where += f" row {row}"
        if field:
            where += f" field {field!r}"
        super().__init__(f"{where}: {message}")


class NotFound(FleetscopeError, LookupError, ValueError):
    """Something named in a request (a job, site, model, dataset, instrument) that the store does not hold.
    The API answers 404, the CLI exits with the message. Also a ``ValueError``: a caller that treats any bad
    argument alike may keep doing so."""


class Conflict(FleetscopeError):
    """A record that would contradict one already stored (the API answers 409)."""
