"""Every registered analysis the service runs, for the API, the CLI and the dashboard to list
(``services.analysis``: per job from ``services.jobs``, per window from ``services.health``, on a clock of
their own from ``services.scheduled``), each with the beat entry that runs it."""

from __future__ import annotations

from typing import Any

from fleetscope.services.analysis import Beat
from fleetscope.services.health import WINDOW
from fleetscope.services.jobs import JOB
from fleetscope.services.scheduled import JOB_BEAT, SCHEDULED, WINDOW_BEAT

ALSO = {"job": "for jobs with new data, from the job's watermark; POST /api/v1/jobs/{id}/analyze",
        "window": "sharded ones once per shard of hosts when FLEETSCOPE_SWEEP_SHARDS > 1; GET /api/v1/health"}


def _beat(beat: Beat, also: str = "") -> dict[str, Any]:
    return {"beat": beat.entry, "task": beat.task, "when": beat.when,
            "runs": f"beat's {beat.entry} ({beat.when}{'; ' + also if also else ''})"}


def analyses() -> list[dict[str, Any]]:
    """Each analysis: name, cadence, when it runs (beat entry, task, schedule), its pure modules, the frames it
    needs, reads and writes, and any files it writes."""
    rows = [{**a.describe(), "files": [], **_beat(beat, ALSO[a.cadence])}
            for registry, beat in ((JOB, JOB_BEAT), (WINDOW, WINDOW_BEAT)) for a in registry]
    sharded = "one task per shard of hosts when FLEETSCOPE_SWEEP_SHARDS > 1"
    return rows + [{**a.describe(), "files": list(a.files), **_beat(a.beat, sharded if a.sharded else "")} for a in SCHEDULED]
