"""Parsers, one module per telemetry source. Each is a pure function from bytes to a ``Batch``."""
