"""How the API answers what it refuses: one place that maps each kind of error to its HTTP status."""

from __future__ import annotations

from fastapi.responses import JSONResponse

from fleetscope.door import screen
from fleetscope.core.errors import Conflict, FleetscopeError, NotFound, ParseError, ValidationError


def error_response(exc: FleetscopeError) -> JSONResponse:
    """The answer to bad input: 422 naming frame, row and field for a value, 400 naming source, line and
    field for text that does not parse, 403 for a push outside its token's binding, 404 for something named
    that the store does not hold, 409 for a record that contradicts a stored one, 400 otherwise."""
    if isinstance(exc, ValidationError):
        return JSONResponse({"detail": str(exc), "frame": exc.frame, "row": exc.row, "field": exc.field}, 422)
    if isinstance(exc, ParseError):
        return JSONResponse({"detail": str(exc), "source": exc.source, "line": exc.line, "field": exc.field}, 400)
    if isinstance(exc, screen.Forbidden):
        return JSONResponse({"detail": str(exc)}, 403)
    if isinstance(exc, NotFound):
        return JSONResponse({"detail": str(exc)}, 404)
    if isinstance(exc, Conflict):
        return JSONResponse({"detail": str(exc)}, 409)
    return JSONResponse({"detail": str(exc)}, 400)


def too_large(limit: int) -> JSONResponse:
    return JSONResponse({"detail": f"request body over the limit of {limit} bytes (FLEETSCOPE_MAX_BODY_BYTES)"}, 413)
