"""Shared fixtures for the ingest tests: the real captures in ``../shared/realdata``."""

from __future__ import annotations

from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
REALDATA = REPO_ROOT.parent / "shared" / "realdata"


@pytest.fixture(scope="session")
def telemetry() -> Path:
    """The folder of real telemetry captures; tests that need it skip, loudly, where it is absent."""
    d = REALDATA / "telemetry"
    if not d.is_dir():
        pytest.skip(f"real data folder {d} is absent (see shared/realdata/README.md)")
    return d
