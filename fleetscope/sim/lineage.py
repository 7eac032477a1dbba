"""A lineage graph as OpenLineage RunEvents, and the governance attributes of its datasets.

The pipeline: crawls and licensed corpora are ingested, filtered and deduplicated into a training mix,
tokenized, and each training job reads the tokens it trains on (RunEvent START/COMPLETE pairs with
``inputs``/``outputs``; OpenLineage spec 2-0-2). Training runs carry Fleetscope's run facets
``fleetscope_job`` ({"jobId"}: the fleet job) and ``fleetscope_model`` ({"name", "version"}). One raw
dataset is quarantined; one model is trained downstream of it and one (the control) is not.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import uuid
from dataclasses import dataclass
from typing import Any

PRODUCER = "https://github.com/fleetscope/fleetscope/tree/main/fleetscope/sim"
SCHEMA_URL = "https://openlineage.io/spec/2-0-2/OpenLineage.json#/$defs/RunEvent"
FACET_SCHEMA = "https://fleetscope.dev/spec/facets/1-0-0/{}.json"
RAW_NS = "s3://fleetscope-raw"
CURATED_NS = "s3://fleetscope-curated"
CKPT_NS = "s3://fleetscope-checkpoints"


def run_id(seed: int, name: str) -> str:
    """A deterministic UUID (hashlib, not uuid4) so the same seed gives the same events."""
    return str(uuid.UUID(bytes=hashlib.sha256(f"{seed}/{name}".encode()).digest()[:16], version=4))


def _iso(t: dt.datetime) -> str:
    return t.astimezone(dt.UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _facet(name: str, body: dict[str, Any]) -> dict[str, Any]:
    return {"_producer": PRODUCER, "_schemaURL": FACET_SCHEMA.format(name), **body}


def _ds(ns: str, name: str) -> dict[str, Any]:
    return {"namespace": ns, "name": name}


@dataclass(frozen=True)
class LineageResult:
    events: list[dict[str, Any]]  # in event-time order
    registry: dict[str, Any]  # {"datasets": [...], "models": [...]}, bodies of PUT /api/v1/datasets and /models
    quarantined: tuple[str, str]  # (namespace, name)
    tainted_model: tuple[str, str]  # (name, version)
    clean_model: tuple[str, str] | None
    tainted_path: list[str]  # node ids from the quarantined dataset to the model


def lineage_events(seed: int, start: dt.datetime, jobs: list[tuple[str, str, dt.datetime, dt.datetime]]) -> LineageResult:
    """``jobs``: (fleet job id, model name, start, end) of each training job. The first trains on the mix
    that includes the quarantined crawl; the second (when there is one) only on licensed books."""
    events: list[dict[str, Any]] = []

    def run(name: str, t0: dt.datetime, t1: dt.datetime, inputs: list[dict], outputs: list[dict],
            facets: dict[str, Any] | None = None, key: str | None = None) -> str:
        rid = run_id(seed, key or name)
        job = {"namespace": "fleetscope-pipelines", "name": name}
        for etype, t, io in (("START", t0, False), ("COMPLETE", t1, True)):
            ev = {"eventType": etype, "eventTime": _iso(t), "producer": PRODUCER, "schemaURL": SCHEMA_URL,
                  "run": {"runId": rid, **({"facets": facets} if facets else {})}, "job": job,
                  "inputs": inputs, "outputs": outputs if io else []}
            events.append(ev)
        return rid

    t = start - dt.timedelta(hours=30)
    h = dt.timedelta(hours=1)
    crawl, forum, books = _ds(RAW_NS, "web-crawl-2024q4"), _ds(RAW_NS, "forum-dump-2023"), _ds(RAW_NS, "licensed-books-v2")
    mix, tokens = _ds(CURATED_NS, "pretrain-mix-v3"), _ds(CURATED_NS, "pretrain-mix-v3-tokens")
    book_tokens = _ds(CURATED_NS, "licensed-books-v2-tokens")
    run("ingest-web-crawl", t, t + 2 * h, [], [crawl])
    run("ingest-forum-dump", t + h, t + 2 * h, [], [forum])
    run("ingest-licensed-books", t + h, t + 3 * h, [], [books])
    run("dedup-filter-mix", t + 4 * h, t + 8 * h, [crawl, forum], [mix])
    run("tokenize-mix", t + 9 * h, t + 12 * h, [mix], [tokens])
    run("tokenize-books", t + 9 * h, t + 11 * h, [books], [book_tokens])
    models: list[dict[str, Any]] = []
    for i, (job_id, model, j0, j1) in enumerate(jobs):
        data = tokens if i != 1 else book_tokens
        version = "1"
        facets = {"fleetscope_job": _facet("FleetscopeJobRunFacet", {"jobId": job_id}),
                  "fleetscope_model": _facet("FleetscopeModelRunFacet", {"name": model, "version": version})}
        rid = run(f"train-{model}", j0, j1, [data], [_ds(CKPT_NS, f"{model}/{job_id}")], facets, key=f"train/{job_id}")
        models.append({"name": model, "version": version, "intended_purpose": "general-purpose text generation (simulated)",
                       "role": "provider", "training_run_ids": [rid]})
    registry = {
        "datasets": [
            {"namespace": RAW_NS, "name": "web-crawl-2024q4", "license": "CC-BY-4.0", "contains_personal_data": True,
             "legal_basis": "legitimate_interests", "provenance": "Common-Crawl-style crawl, robots.txt honoured"},
            {"namespace": RAW_NS, "name": "forum-dump-2023", "license": "unknown", "contains_personal_data": True,
             "legal_basis": "legitimate_interests", "provenance": "third-party forum export",
             "quarantined": True, "quarantine_reason": "licence withdrawn by the provider; personal data without opt-out"},
            {"namespace": RAW_NS, "name": "licensed-books-v2", "license": "commercial licence FS-2024-117",
             "provenance": "publisher agreement 2024"},
        ],
        "models": models,
    }
    tainted = (jobs[0][1], "1") if jobs else ("", "")
    clean = (jobs[1][1], "1") if len(jobs) > 1 else None
    path = [f"dataset:{RAW_NS}:forum-dump-2023", f"dataset:{CURATED_NS}:pretrain-mix-v3",
            f"dataset:{CURATED_NS}:pretrain-mix-v3-tokens", f"model:{tainted[0]}:{tainted[1]}"]
    events.sort(key=lambda e: (e["eventTime"], e["eventType"] != "START"))
    return LineageResult(events, registry, (RAW_NS, "forum-dump-2023"), tainted, clean, path)
