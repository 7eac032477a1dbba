"""Every registered analysis the service runs, for the API, the CLI and the dashboard to list
(``services.analysis``: per job from ``services.jobs``, per window from ``services.health``)."""

from __future__ import annotations

from typing import Any

from fleetscope.services.health import WINDOW
from fleetscope.services.jobs import JOB

SCHEDULE = {"job": "beat's analyze-active-jobs (every minute, for jobs with new data, from the job's watermark); POST /api/v1/jobs/{id}/analyze",
            "window": "beat's health-window (every 5 minutes; sharded ones once per shard of hosts when FLEETSCOPE_SWEEP_SHARDS > 1); GET /api/v1/health"}


def analyses() -> list[dict[str, Any]]:
    """Each analysis: name, cadence, when it runs, its pure modules, the frames it needs, reads and writes."""
    return [{**a.describe(), "runs": SCHEDULE[a.cadence]} for registry in (JOB, WINDOW) for a in registry]
