"""The core floor: canonical frames and ``Batch``, errors, text and wire input.

Everything here is pure (no database, network, clock or device) and imports nothing of the project
outside this package, so ``ingest/``, ``analyzers/`` and ``governance/`` can stand on it alone.
"""
