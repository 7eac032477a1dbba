"""OpenLineage ingest: a request body decoded, checked against the spec and turned into lineage records
(``governance.lineage``).

Spec 2-0-x, https://openlineage.io/spec/2-0-2/OpenLineage.json: ``parse_body`` decodes a request body (gzip
as the Python client's ``compression: gzip`` sends it), ``validate_event`` checks it against the schema
(``governance.openlineage_schema``) and ``parse_event`` turns it into records: the job, the run state
change, datasets, one input/output edge per dataset, column lineage from ``columnLineage``
(ColumnLineageDatasetFacet 1-2-0). Facets Fleetscope does not know are kept verbatim and named in
``ParsedEvent.notes``; they are never fatal.

Fleetscope's own run facets (names prefixed, as the spec asks of custom facets):

- ``fleetscope_job``: ``{"jobId": "<scheduler job id>"}`` links a lineage run to the fleet job whose
  telemetry (compute, energy, failures) it produced;
- ``fleetscope_model``: ``{"name": ..., "version": ...}`` says the run trained that model version.

Both carry ``_producer``/``_schemaURL`` like every facet (BaseFacet).

Pure: bytes or JSON in, records out; no database, HTTP or clock.
"""

from __future__ import annotations

import hashlib
import zlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import orjson

from fleetscope.core.errors import FleetscopeError
from governance import openlineage_schema as ols
from governance.lineage import ColumnEdge, DatasetRecord, DatasetRef, IoEdge, JobRecord, JobRef, ParsedEvent, RunEventRecord

MAX_BODY_BYTES = 16 * 2**20
"""Largest decoded event accepted; OpenLineage events are kilobytes, a gzip bomb is not."""

MAX_NESTING = 64
"""Deepest JSON nesting accepted. The schema nests six levels; deep schema facets of nested structs
reach twenty or so. orjson itself stops at 1024."""

FLEETSCOPE_JOB_FACET = "fleetscope_job"
FLEETSCOPE_MODEL_FACET = "fleetscope_model"

# Facet names defined by the OpenLineage spec (spec/facets/*.json) as of 2-0-2. Anything else is kept but
# reported, so a producer learns that Fleetscope stored without understanding it.
KNOWN_RUN_FACETS = frozenset(
    {"nominalTime", "parent", "errorMessage", "externalQuery", "processing_engine", "environmentVariables",
     "environment-properties", "tags", "executionParameters", "extractionError", "jobDependencies", "test",
     FLEETSCOPE_JOB_FACET, FLEETSCOPE_MODEL_FACET}
)
KNOWN_JOB_FACETS = frozenset({"documentation", "ownership", "sourceCode", "sourceCodeLocation", "sql", "jobType", "tags"})
KNOWN_DATASET_FACETS = frozenset(
    {"schema", "dataSource", "columnLineage", "ownership", "documentation", "lifecycleStateChange", "version",
     "storage", "symlinks", "tags", "catalog", "datasetType", "hierarchy", "subset"}
)
KNOWN_INPUT_FACETS = frozenset({"dataQualityAssertions", "dataQualityMetrics", "inputStatistics", "subset"})
KNOWN_OUTPUT_FACETS = frozenset({"outputStatistics"})


class LineageError(FleetscopeError, ValueError):
    """An event Fleetscope refuses: ``path`` is the JSON Pointer of the first problem, ``issues`` all of
    them (at most 20). The API answers 400 for bodies that are not JSON, 422 for schema violations."""

    def __init__(self, message: str, *, path: str = "", issues: Sequence[ols.SchemaIssue] = (), malformed: bool = False):
        self.message = message
        self.path = path
        self.issues = tuple(issues)[:20]
        self.malformed = malformed
        super().__init__(f"{path or '/'}: {message}")

    def to_dict(self) -> dict[str, Any]:
        return {"error": self.message, "path": self.path, "issues": [{"path": i.path, "message": i.message} for i in self.issues]}


# --- decoding and validation ---------------------------------------------------------------------


def decode_body(body: bytes, *, content_encoding: str | None = None, max_bytes: int = MAX_BODY_BYTES) -> Any:
    """The JSON value in a request body; gzip/deflate bodies are inflated up to ``max_bytes``.

    Raises ``LineageError`` (``malformed=True``) for a body that is not JSON, with orjson's line and
    column, for one nested deeper than ``MAX_NESTING``, and for an oversized or corrupt compressed body.
    """
    enc = (content_encoding or "identity").strip().lower()
    if enc in ("gzip", "x-gzip", "deflate"):
        # Inflate in bounded steps so a small bomb cannot allocate gigabytes.
        d = zlib.decompressobj(wbits=31 if enc != "deflate" else 15)
        try:
            raw = d.decompress(body, max_bytes + 1)
        except zlib.error as exc:
            raise LineageError(f"corrupt {enc} body: {exc}", malformed=True) from None
        if len(raw) > max_bytes or d.unconsumed_tail:
            raise LineageError(f"decompressed body exceeds {max_bytes} bytes", malformed=True)
        if not d.eof:
            raise LineageError(f"truncated {enc} body", malformed=True)
        body = raw
    elif enc != "identity":
        raise LineageError(f"unsupported Content-Encoding {content_encoding!r} (identity, gzip, deflate)", malformed=True)
    if len(body) > max_bytes:
        raise LineageError(f"body exceeds {max_bytes} bytes", malformed=True)
    try:
        value = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise LineageError(f"not valid JSON: {exc}", malformed=True) from None
    depth = _nesting(value)
    if depth > MAX_NESTING:
        raise LineageError(f"JSON nested {depth} levels deep; at most {MAX_NESTING} accepted", malformed=True)
    return value


def _nesting(value: Any) -> int:
    """Deepest nesting of containers, iteratively (no recursion limit to hit)."""
    deepest = 0
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        v, d = stack.pop()
        if isinstance(v, dict):
            deepest = max(deepest, d)
            if d <= MAX_NESTING:
                stack.extend((x, d + 1) for x in v.values())
        elif isinstance(v, list):
            deepest = max(deepest, d)
            if d <= MAX_NESTING:
                stack.extend((x, d + 1) for x in v)
    return deepest


@dataclass(frozen=True)
class Validated:
    """An event that passed the schema: its kind and what the caller should be told."""

    kind: str
    notes: tuple[str, ...]


def validate_event(event: Any) -> Validated:
    """Check ``event`` against the OpenLineage 2-0-x schema and Fleetscope's own run facets.

    Raises ``LineageError`` with the JSON Pointer of the first violation and the list of all of them.
    Unknown facets and a date-time without offset are not errors; they come back as notes.
    """
    kind, issues = ols.classify(event)
    if kind is None:
        first = issues[0]
        raise LineageError(first.message, path=first.path, issues=issues)
    issues = list(_fleetscope_facet_issues(event)) if kind == "RunEvent" else []
    if issues:
        raise LineageError(issues[0].message, path=issues[0].path, issues=issues)
    notes: list[str] = []
    _dt, had_offset = ols.parse_datetime(event["eventTime"])  # type: ignore[misc]
    if not had_offset:
        notes.append(f"/eventTime {event['eventTime']!r} has no UTC offset; read as UTC")
    notes.extend(_unknown_facets(event, kind))
    return Validated(kind, tuple(notes))


def _fleetscope_facet_issues(event: Mapping[str, Any]) -> Iterable[ols.SchemaIssue]:
    """Our facets have a schema of their own; a link to a job or model that cannot be read is refused
    rather than stored half-understood."""
    facets = (event.get("run") or {}).get("facets") or {}
    jf = facets.get(FLEETSCOPE_JOB_FACET)
    if jf is not None:
        v = jf.get("jobId")
        if not isinstance(v, str) or not v.strip():
            yield ols.SchemaIssue(ols.pointer("run", "facets", FLEETSCOPE_JOB_FACET, "jobId"), "required non-empty string (the scheduler's job id)")
    mf = facets.get(FLEETSCOPE_MODEL_FACET)
    if mf is not None:
        for k in ("name", "version"):
            v = mf.get(k)
            if not isinstance(v, str) or not v.strip():
                yield ols.SchemaIssue(ols.pointer("run", "facets", FLEETSCOPE_MODEL_FACET, k), "required non-empty string")


def _unknown_facets(event: Mapping[str, Any], kind: str) -> Iterable[str]:
    """Only the parts the event's kind defines are read: a DatasetEvent may carry a ``run`` or ``job``
    of any shape (the schema does not look at them), and Fleetscope ignores them too."""
    def names(facets: Any, known: frozenset[str], path: str) -> Iterable[str]:
        for n in (facets or {}):
            if n not in known:
                yield f"{path}{ols.pointer(n)}: facet not known to Fleetscope; kept as sent"

    if kind == "DatasetEvent":
        yield from names(event["dataset"].get("facets"), KNOWN_DATASET_FACETS, "/dataset/facets")
        return
    if kind == "RunEvent":
        yield from names(event["run"].get("facets"), KNOWN_RUN_FACETS, "/run/facets")
    yield from names(event["job"].get("facets"), KNOWN_JOB_FACETS, "/job/facets")
    for key, extra, known in (("inputs", "inputFacets", KNOWN_INPUT_FACETS), ("outputs", "outputFacets", KNOWN_OUTPUT_FACETS)):
        for i, ds in enumerate(event.get(key) or []):
            yield from names(ds.get("facets"), KNOWN_DATASET_FACETS, f"/{key}/{i}/facets")
            yield from names(ds.get(extra), known, f"/{key}/{i}/{extra}")


# --- events to records ---------------------------------------------------------------------------


def event_id(event: Mapping[str, Any]) -> str:
    """Content hash of an event (sorted keys), so the same event posted twice is stored once."""
    return hashlib.sha256(orjson.dumps(event, option=orjson.OPT_SORT_KEYS)).hexdigest()


def _dt(value: Any) -> datetime | None:
    if not isinstance(value, str):
        return None
    parsed = ols.parse_datetime(value)
    return parsed[0] if parsed else None


def _str(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None


def parse_event(event: Any) -> ParsedEvent:
    """Validate ``event`` and turn it into records. Raises ``LineageError`` as ``validate_event``."""
    checked = validate_event(event)
    t = _dt(event["eventTime"])
    assert t is not None  # validated
    jobs: list[JobRecord] = []
    runs: list[RunEventRecord] = []
    datasets: list[DatasetRecord] = []
    io: list[IoEdge] = []
    columns: list[ColumnEdge] = []
    job_ref: JobRef | None = None
    run_id = ""
    if "job" in event and checked.kind != "DatasetEvent":
        j = event["job"]
        job_ref = JobRef(j["namespace"], j["name"])
        jobs.append(JobRecord(job_ref, t, dict(j.get("facets") or {})))
    if checked.kind == "RunEvent":
        assert job_ref is not None
        run = event["run"]
        run_id = run["runId"].lower()  # UUIDs compare case-insensitively; store one spelling
        rf = dict(run.get("facets") or {})
        parent = rf.get("parent") if isinstance(rf.get("parent"), dict) else {}
        prun = parent.get("run") if isinstance(parent.get("run"), dict) else {}
        pjob = parent.get("job") if isinstance(parent.get("job"), dict) else {}
        nominal = rf.get("nominalTime") if isinstance(rf.get("nominalTime"), dict) else {}
        fj = rf.get(FLEETSCOPE_JOB_FACET) or {}
        fm = rf.get(FLEETSCOPE_MODEL_FACET) or {}
        pid = _str(prun.get("runId"))
        runs.append(
            RunEventRecord(
                run_id=run_id,
                event_type=event.get("eventType") or "OTHER",
                event_time=t,
                job=job_ref,
                parent_run_id=pid.lower() if pid else None,
                parent_job=JobRef(pjob["namespace"], pjob["name"]) if _str(pjob.get("namespace")) and _str(pjob.get("name")) else None,
                nominal_start_time=_dt(nominal.get("nominalStartTime")),
                nominal_end_time=_dt(nominal.get("nominalEndTime")),
                fleet_job_id=_str(fj.get("jobId")),
                model_name=_str(fm.get("name")),
                model_version=_str(fm.get("version")),
                facets=rf,
            )
        )
    if checked.kind == "DatasetEvent":
        ds = event["dataset"]
        datasets.append(DatasetRecord(DatasetRef(ds["namespace"], ds["name"]), t, dict(ds.get("facets") or {})))
    else:
        for key, direction, extra in (("inputs", "input", "inputFacets"), ("outputs", "output", "outputFacets")):
            for ds in event.get(key) or []:
                ref = DatasetRef(ds["namespace"], ds["name"])
                facets = dict(ds.get("facets") or {})
                datasets.append(DatasetRecord(ref, t, facets))
                assert job_ref is not None
                io.append(IoEdge(run_id, job_ref, direction, ref, t, dict(ds.get(extra) or {})))
                if direction == "output":
                    columns.extend(_column_edges(run_id, ref, facets.get("columnLineage"), t))
    return ParsedEvent(
        kind=checked.kind,
        event_id=event_id(event),
        event_time=t,
        jobs=tuple(jobs),
        runs=tuple(runs),
        datasets=tuple(datasets),
        io=tuple(io),
        columns=tuple(columns),
        notes=checked.notes,
        raw=event,
    )


def _column_edges(run_id: str, output: DatasetRef, facet: Any, t: datetime) -> list[ColumnEdge]:
    """ColumnLineageDatasetFacet 1-2-0: ``fields.<out>.inputFields[]`` and dataset-wide ``dataset[]``.

    Entries missing ``namespace``/``name``/``field`` are skipped: the core schema does not check facet
    bodies, and one bad entry should not cost the rest of the event.
    """
    if not isinstance(facet, dict):
        return []
    out: list[ColumnEdge] = []

    def add(out_field: str, inputs: Any, fallback_type: Any) -> None:
        for inp in inputs if isinstance(inputs, list) else []:
            if not isinstance(inp, dict) or not all(isinstance(inp.get(k), str) for k in ("namespace", "name", "field")):
                continue
            trs = [x for x in inp.get("transformations") or [] if isinstance(x, dict)] or [{"type": fallback_type}]
            for tr in trs:
                out.append(
                    ColumnEdge(
                        run_id, output, out_field, DatasetRef(inp["namespace"], inp["name"]), inp["field"],
                        _str(tr.get("type")), _str(tr.get("subtype")),
                        tr.get("masking") if isinstance(tr.get("masking"), bool) else None, t,
                    )
                )

    fields = facet.get("fields")
    for name, spec in (fields.items() if isinstance(fields, dict) else []):
        if isinstance(spec, dict):
            add(name, spec.get("inputFields"), spec.get("transformationType"))
    add("", facet.get("dataset"), None)
    return out


def parse_body(body: bytes, *, content_encoding: str | None = None, max_bytes: int = MAX_BODY_BYTES) -> ParsedEvent:
    """What ``POST /api/v1/lineage`` does before storing: decode, validate, parse."""
    return parse_event(decode_body(body, content_encoding=content_encoding, max_bytes=max_bytes))
