"""Alembic environment and versions for the Fleetscope schema."""
