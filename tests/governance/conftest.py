"""Fixtures for governance tests: the real OpenLineage and COMPAS files in ``../shared/realdata``.

Tests read them in place; runtime code never does. Where the folder is absent the tests that need it
skip and say where they looked.
"""

from __future__ import annotations

from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
REALDATA = REPO_ROOT.parent / "shared" / "realdata"


def _need(sub: str) -> Path:
    d = REALDATA / sub
    if not d.is_dir():
        pytest.skip(f"real data folder {d} is absent (see shared/realdata/README.md)")
    return d


@pytest.fixture(scope="session")
def openlineage_dir() -> Path:
    return _need("openlineage")


@pytest.fixture(scope="session")
def compas_dir() -> Path:
    return _need("compas")
