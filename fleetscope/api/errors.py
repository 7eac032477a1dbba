"""How the API answers what it refuses: one place that maps each kind of error to its HTTP status."""

from __future__ import annotations

from fastapi.responses import JSONResponse

from fleetscope import door
from fleetscope.core.errors import FleetscopeError, ParseError, ValidationError


def error_response(exc: FleetscopeError) -> JSONResponse:
    """The answer to bad input: 422 naming frame, row and field for a value, 400 naming source, line and
    field for text that does not parse, 400 otherwise."""
    if isinstance(exc, ValidationError):
        return JSONResponse({"detail": str(exc), "frame": exc.frame, "row": exc.row, "field": exc.field}, 422)
    if isinstance(exc, ParseError):
        return JSONResponse({"detail": str(exc), "source": exc.source, "line": exc.line, "field": exc.field}, 400)
    if isinstance(exc, door.Forbidden):
        return JSONResponse({"detail": str(exc)}, 403)
    return JSONResponse({"detail": str(exc)}, 400)


def too_large(limit: int) -> JSONResponse:
    return JSONResponse({"detail": f"request body over the limit of {limit} bytes (FLEETSCOPE_MAX_BODY_BYTES)"}, 413)
