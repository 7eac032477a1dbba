"""The HTTP API (FastAPI). ``create_app`` builds it; ``fleetscope serve`` runs it under uvicorn."""

from fleetscope.api.app import create_app

__all__ = ["create_app"]
