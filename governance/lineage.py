"""Lineage records and queries: which data trained which model, and what it carried along.

Pure: records in, answers out; no database, HTTP or clock. The records come from OpenLineage events
(``governance.lineage_events``); the service layer stores them (tables in ``governance.frames``) and serves
``GET /api/v1/lineage?nodeId=...&depth=...`` with these functions.

Queries run on a ``LineageGraph`` built from the edge records. Lineage is followed at run level, and an
edge from a producing run to a consuming run through dataset D counts only if the producer wrote D no
later than the consumer's last event: data written after a training run finished cannot have trained it.
"""

from __future__ import annotations

import json
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from fleetscope.core.errors import NotFound
from governance.registry import DatasetEntry, ModelEntry

# Marquez's RunState for each OpenLineage eventType (Marquez maps events the same way).
RUN_STATE = {"START": "RUNNING", "RUNNING": "RUNNING", "COMPLETE": "COMPLETED", "ABORT": "ABORTED", "FAIL": "FAILED"}


class LineageNotFound(NotFound):
    """A node, model or dataset the graph does not hold (the API answers 404, as Marquez does)."""


# --- records -------------------------------------------------------------------------------------


@dataclass(frozen=True, order=True)
class DatasetRef:
    namespace: str
    name: str

    @property
    def node_id(self) -> str:
        """Marquez's node id: ``dataset:<namespace>:<name>``."""
        return f"dataset:{self.namespace}:{self.name}"


@dataclass(frozen=True, order=True)
class JobRef:
    namespace: str
    name: str

    @property
    def node_id(self) -> str:
        """Marquez's node id: ``job:<namespace>:<name>``."""
        return f"job:{self.namespace}:{self.name}"


@dataclass(frozen=True)
class JobRecord:
    job: JobRef
    event_time: datetime
    facets: dict[str, Any]


@dataclass(frozen=True)
class DatasetRecord:
    dataset: DatasetRef
    event_time: datetime
    facets: dict[str, Any]

    @property
    def fields(self) -> list[dict[str, Any]]:
        """The ``schema`` facet's fields (name, type, description), empty when the producer sent none."""
        schema = self.facets.get("schema")
        return list(schema.get("fields") or []) if isinstance(schema, dict) else []


@dataclass(frozen=True)
class RunEventRecord:
    """One state change of one run (a RunEvent)."""

    run_id: str
    event_type: str
    event_time: datetime
    job: JobRef
    parent_run_id: str | None = None
    parent_job: JobRef | None = None
    nominal_start_time: datetime | None = None
    nominal_end_time: datetime | None = None
    fleet_job_id: str | None = None
    model_name: str | None = None
    model_version: str | None = None
    facets: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class IoEdge:
    """Dataset read (``input``) or written (``output``) by a run; ``run_id`` is ``""`` for the static
    lineage a JobEvent declares."""

    run_id: str
    job: JobRef
    direction: str
    dataset: DatasetRef
    event_time: datetime
    facets: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class ColumnEdge:
    """``output.output_field`` is computed from ``input.input_field`` (``output_field == ""``: the input
    affects the whole dataset, e.g. a filter or join key)."""

    run_id: str
    output: DatasetRef
    output_field: str
    input: DatasetRef
    input_field: str
    transformation_type: str | None = None
    transformation_subtype: str | None = None
    masking: bool | None = None
    event_time: datetime | None = None


@dataclass(frozen=True)
class ParsedEvent:
    kind: str
    event_id: str
    event_time: datetime
    jobs: tuple[JobRecord, ...]
    runs: tuple[RunEventRecord, ...]
    datasets: tuple[DatasetRecord, ...]
    io: tuple[IoEdge, ...]
    columns: tuple[ColumnEdge, ...]
    notes: tuple[str, ...]
    raw: dict[str, Any]


def models_from_runs(runs: Iterable[RunEventRecord]) -> dict[tuple[str, str], set[str]]:
    """``(model name, version) -> run ids`` declared through the ``fleetscope_model`` run facet."""
    out: dict[tuple[str, str], set[str]] = {}
    for r in runs:
        if r.model_name and r.model_version:
            out.setdefault((r.model_name, r.model_version), set()).add(r.run_id)
    return out


# --- the graph -----------------------------------------------------------------------------------


@dataclass
class RunInfo:
    """A run folded from its events; static JobEvent lineage is a pseudo-run keyed ``job:<ns>:<name>``."""

    key: str
    job: JobRef
    first_time: datetime
    last_time: datetime
    state: str | None = None
    parent_key: str | None = None
    fleet_job_id: str | None = None
    model: tuple[str, str] | None = None

    @property
    def node_id(self) -> str:
        return self.key if self.key.startswith("job:") else f"run:{self.key}"


@dataclass(frozen=True)
class PathStep:
    """One node on a lineage path: ``kind`` is dataset, run, job (static lineage) or model."""

    kind: str
    id: str
    label: str

    def to_dict(self) -> dict[str, str]:
        return {"kind": self.kind, "id": self.id, "label": self.label}


def render_path(path: Sequence[PathStep]) -> str:
    return " -> ".join(s.label for s in path)


class LineageGraph:
    """Run-level lineage built from ``IoEdge`` and ``RunEventRecord`` records (or their frames)."""

    def __init__(self, io: Iterable[IoEdge], runs: Iterable[RunEventRecord] = (), datasets: Iterable[DatasetRecord] = ()):
        self.runs: dict[str, RunInfo] = {}
        self.inputs: dict[str, dict[DatasetRef, datetime]] = {}
        self.outputs: dict[str, dict[DatasetRef, datetime]] = {}
        self.producers: dict[DatasetRef, dict[str, datetime]] = {}
        self.consumers: dict[DatasetRef, dict[str, datetime]] = {}
        self.dataset_fields: dict[DatasetRef, list[dict[str, Any]]] = {}
        self.job_facets: dict[JobRef, dict[str, Any]] = {}
        for r in sorted(runs, key=lambda r: r.event_time):
            info = self.runs.get(r.run_id)
            if info is None:
                info = self.runs[r.run_id] = RunInfo(r.run_id, r.job, r.event_time, r.event_time)
            info.first_time = min(info.first_time, r.event_time)
            info.last_time = max(info.last_time, r.event_time)
            # Terminal states win over OTHER/RUNNING events sent later with extra metadata.
            if r.event_type in RUN_STATE and (info.state not in ("COMPLETED", "FAILED", "ABORTED") or r.event_type in ("COMPLETE", "FAIL", "ABORT")):
                info.state = RUN_STATE[r.event_type]
            info.parent_key = r.parent_run_id or info.parent_key
            info.fleet_job_id = r.fleet_job_id or info.fleet_job_id
            if r.model_name and r.model_version:
                info.model = (r.model_name, r.model_version)
        for e in io:
            key = e.run_id or e.job.node_id
            info = self.runs.get(key)
            if info is None:
                info = self.runs[key] = RunInfo(key, e.job, e.event_time, e.event_time)
            else:
                info.first_time = min(info.first_time, e.event_time)
                info.last_time = max(info.last_time, e.event_time)
            side, index = (self.inputs, self.consumers) if e.direction == "input" else (self.outputs, self.producers)
            d = side.setdefault(key, {})
            d[e.dataset] = min(d.get(e.dataset, e.event_time), e.event_time)
            x = index.setdefault(e.dataset, {})
            x[key] = min(x.get(key, e.event_time), e.event_time)
        for d in sorted(datasets, key=lambda d: d.event_time):
            if d.fields:
                self.dataset_fields[d.dataset] = d.fields
        self.children: dict[str, set[str]] = {}
        for k, info in self.runs.items():
            if info.parent_key:
                self.children.setdefault(info.parent_key, set()).add(k)

    @classmethod
    def from_events(cls, events: Iterable[ParsedEvent]) -> LineageGraph:
        evs = list(events)
        return cls(
            (e for ev in evs for e in ev.io),
            (r for ev in evs for r in ev.runs),
            (d for ev in evs for d in ev.datasets),
        )

    # -- helpers

    @property
    def datasets(self) -> set[DatasetRef]:
        return set(self.producers) | set(self.consumers)

    def _run_step(self, key: str) -> PathStep:
        info = self.runs[key]
        if key.startswith("job:"):
            return PathStep("job", key, f"{key} (static lineage)")
        return PathStep("run", info.node_id, f"run:{key} (job {info.job.namespace}/{info.job.name})")

    @staticmethod
    def _ds_step(ds: DatasetRef) -> PathStep:
        return PathStep("dataset", ds.node_id, ds.node_id)

    def _feeds(self, producer: str, ds: DatasetRef, consumer: str) -> bool:
        """Could what ``producer`` wrote to ``ds`` have been read by ``consumer``? Only if it was
        written no later than the consumer's last event."""
        return self.outputs[producer][ds] <= self.runs[consumer].last_time

    def run_closure(self, run_ids: Iterable[str]) -> dict[str, tuple[PathStep, ...]]:
        """The runs and, through the ``parent`` facet, their descendant runs (a DAG run's tasks), each with
        the path of parent links from it up to a starting run."""
        out: dict[str, tuple[PathStep, ...]] = {}
        queue: deque[str] = deque()
        for r in run_ids:
            r = r.lower()
            if r in self.runs and r not in out:
                out[r] = (self._run_step(r),)
                queue.append(r)
        while queue:
            r = queue.popleft()
            for c in sorted(self.children.get(r, ())):
                if c not in out:
                    out[c] = (self._run_step(c), *out[r])
                    queue.append(c)
        return out

    # -- queries

    def upstream(self, run_ids: Iterable[str], tail: Sequence[PathStep] = ()) -> dict[DatasetRef, tuple[PathStep, ...]]:
        """Every dataset upstream of the runs, with the shortest path proving it (dataset first, then the
        runs and datasets it flowed through, then ``tail``). Breadth-first, so paths are shortest."""
        seen_runs = {k: (*p, *tail) for k, p in self.run_closure(run_ids).items()}
        found: dict[DatasetRef, tuple[PathStep, ...]] = {}
        queue: deque[str] = deque(sorted(seen_runs))
        while queue:
            r = queue.popleft()
            for ds in sorted(self.inputs.get(r, {})):
                if ds not in found:
                    found[ds] = (self._ds_step(ds), *seen_runs[r])
                # Each consumer admits its own producers: one that finished later admits more of them.
                for p in sorted(self.producers.get(ds, {})):
                    if p not in seen_runs and self._feeds(p, ds, r):
                        seen_runs[p] = (self._run_step(p), self._ds_step(ds), *seen_runs[r])
                        queue.append(p)
        return found

    def downstream(self, source: DatasetRef) -> tuple[dict[DatasetRef, tuple[PathStep, ...]], dict[str, tuple[PathStep, ...]]]:
        """Datasets derived from ``source`` and the runs that read it or anything derived from it, each
        with a path from ``source``: the mirror image of ``upstream``, with the same timing rule."""
        # reach[ds][producer] = path from source to ds through that producer ("" for the source itself)
        reach: dict[DatasetRef, dict[str, tuple[PathStep, ...]]] = {source: {"": (self._ds_step(source),)}}
        run_paths: dict[str, tuple[PathStep, ...]] = {}
        queue: deque[DatasetRef] = deque([source])
        while queue:
            ds = queue.popleft()
            for r in sorted(self.consumers.get(ds, {})):
                if r in run_paths:
                    continue
                # The source taints every reader; a derived dataset only readers that ended after the write.
                ways = [p for k, p in reach[ds].items() if k == "" or self._feeds(k, ds, r)]
                if not ways:
                    continue
                run_paths[r] = (*min(ways, key=len), self._run_step(r))
                for out in sorted(self.outputs.get(r, {})):
                    if out == source:
                        continue
                    known = reach.setdefault(out, {})
                    if r not in known:
                        known[r] = (*run_paths[r], self._ds_step(out))
                        # A new producer may admit readers the earlier ones could not: look again.
                        queue.append(out)
        ds_paths = {d: min(ps.values(), key=len) for d, ps in reach.items()}
        return ds_paths, run_paths

    def marquez_graph(self, node_id: str, depth: int = 20, registry: Mapping[DatasetRef, DatasetEntry] | None = None) -> dict[str, Any]:
        """``GET /api/v1/lineage?nodeId=...&depth=...`` in Marquez's shape (https://marquezproject.ai/docs/api/get-lineage/):
        ``{"graph": [{"id", "type": "JOB"|"DATASET", "data", "inEdges", "outEdges"}]}``.

        As in Marquez, the graph is job-level: runs of a job are merged, jobs within ``depth`` steps of
        the start (two jobs are one step apart when they share a dataset, read or written) are included
        with every dataset they read or write; a dataset start begins from all jobs touching it. Nodes are
        sorted by id. Edges: dataset -> job for inputs, job -> dataset for outputs. Dataset ``data`` adds
        a ``governance`` object from ``registry`` (Fleetscope's extension).
        """
        if depth < 0:
            raise ValueError("depth must be >= 0")
        job_in: dict[JobRef, set[DatasetRef]] = {}
        job_out: dict[JobRef, set[DatasetRef]] = {}
        latest: dict[JobRef, RunInfo] = {}
        for key, info in self.runs.items():
            job_in.setdefault(info.job, set()).update(self.inputs.get(key, {}))
            job_out.setdefault(info.job, set()).update(self.outputs.get(key, {}))
            if not key.startswith("job:") and (info.job not in latest or info.last_time > latest[info.job].last_time):
                latest[info.job] = info
        ds_jobs: dict[DatasetRef, set[JobRef]] = {}
        for j in job_in:
            for d in job_in[j] | job_out[j]:
                ds_jobs.setdefault(d, set()).add(j)
        start = self._resolve_node(node_id, set(job_in), set(ds_jobs))
        frontier = {start} if isinstance(start, JobRef) else set(ds_jobs[start])
        jobs = set(frontier)
        for _ in range(depth):
            nxt = {j2 for j in frontier for d in job_in[j] | job_out[j] for j2 in ds_jobs[d]} - jobs
            if not nxt:
                break
            jobs |= nxt
            frontier = nxt
        nodes: list[dict[str, Any]] = []

        def ids(ds: Iterable[DatasetRef]) -> list[dict[str, str]]:
            return [{"namespace": d.namespace, "name": d.name} for d in sorted(ds)]

        datasets: set[DatasetRef] = set()
        for j in jobs:
            datasets |= job_in[j] | job_out[j]
            run = latest.get(j)
            nodes.append({
                "id": j.node_id,
                "type": "JOB",
                "data": {
                    "id": {"namespace": j.namespace, "name": j.name},
                    "type": "BATCH",
                    "name": j.name,
                    "simpleName": j.name,
                    "namespace": j.namespace,
                    "inputs": ids(job_in[j]),
                    "outputs": ids(job_out[j]),
                    "latestRun": None if run is None else {
                        "id": run.key, "state": run.state, "startedAt": _iso(run.first_time), "endedAt": _iso(run.last_time),
                        "fleetJobId": run.fleet_job_id,
                    },
                },
                "inEdges": [{"origin": d.node_id, "destination": j.node_id} for d in sorted(job_in[j])],
                "outEdges": [{"origin": j.node_id, "destination": d.node_id} for d in sorted(job_out[j])],
            })
        for d in datasets:
            gov = (registry or {}).get(d)
            nodes.append({
                "id": d.node_id,
                "type": "DATASET",
                "data": {
                    "id": {"namespace": d.namespace, "name": d.name},
                    "type": "DB_TABLE",
                    "name": d.name,
                    "physicalName": d.name,
                    "namespace": d.namespace,
                    "sourceName": d.namespace,
                    "fields": [{"name": f.get("name"), "type": f.get("type"), "tags": [], "description": f.get("description")}
                               for f in self.dataset_fields.get(d, []) if isinstance(f, dict)],
                    "governance": None if gov is None else _entry_dict(gov),
                },
                "inEdges": [{"origin": j.node_id, "destination": d.node_id} for j in sorted(jobs) if d in job_out[j]],
                "outEdges": [{"origin": d.node_id, "destination": j.node_id} for j in sorted(jobs) if d in job_in[j]],
            })
        nodes.sort(key=lambda n: n["id"])
        return {"graph": nodes}

    def _resolve_node(self, node_id: str, jobs: set[JobRef], datasets: set[DatasetRef]) -> JobRef | DatasetRef:
        """Parse ``job:<ns>:<name>`` / ``dataset:<ns>:<name>``. Namespaces often hold colons
        (``postgres://host:5432``), so every split is tried against the nodes the graph knows."""
        kind, _, rest = node_id.partition(":")
        if kind not in ("job", "dataset") or not rest:
            raise LineageNotFound(f"node id {node_id!r} must be job:<namespace>:<name> or dataset:<namespace>:<name>")
        cands = [(rest[:i], rest[i + 1 :]) for i, c in enumerate(rest) if c == ":"]
        for ns, name in cands:
            ref: JobRef | DatasetRef = JobRef(ns, name) if kind == "job" else DatasetRef(ns, name)
            if ref in (jobs if kind == "job" else datasets):
                return ref
        raise LineageNotFound(f"no {kind} {rest!r} in the lineage graph")


def _iso(t: datetime) -> str:
    return t.isoformat().replace("+00:00", "Z")


def _entry_dict(e: DatasetEntry) -> dict[str, Any]:
    return {
        "license": e.license, "containsPersonalData": e.contains_personal_data, "specialCategoryData": e.special_category_data,
        "legalBasis": e.legal_basis, "art9Condition": e.art9_condition, "provenance": e.provenance,
        "quarantined": e.quarantined, "quarantineReason": e.quarantine_reason,
    }


# --- model questions ------------------------------------------------------------------------------


def _model_step(model: ModelEntry) -> PathStep:
    return PathStep("model", model.node_id, model.node_id)


def training_runs(graph: LineageGraph, model: ModelEntry) -> set[str]:
    """The model's training runs: the registry's list plus runs whose ``fleetscope_model`` facet names
    this model version (either way of linking is enough)."""
    declared = {k for k, info in graph.runs.items() if info.model == (model.name, model.version)}
    return {r.lower() for r in model.training_run_ids} | declared


@dataclass(frozen=True)
class UpstreamDataset:
    dataset: DatasetRef
    hops: int
    path: tuple[PathStep, ...]

    def to_dict(self) -> dict[str, Any]:
        return {"dataset": self.dataset.node_id, "hops": self.hops, "path": [s.to_dict() for s in self.path], "text": render_path(self.path)}


def upstream_datasets(graph: LineageGraph, model: ModelEntry) -> list[UpstreamDataset]:
    """Every dataset upstream of ``model``'s training runs (and their child runs), nearest first, with the
    path dataset -> run -> ... -> model proving each. ``hops`` counts the runs on the path."""
    found = graph.upstream(training_runs(graph, model), (_model_step(model),))
    out = [UpstreamDataset(d, sum(1 for s in p if s.kind in ("run", "job")), p) for d, p in found.items()]
    return sorted(out, key=lambda u: (u.hops, u.dataset))


@dataclass(frozen=True)
class IngestAnswer:
    """Answer to "did model M ever ingest dataset D, or anything derived from it?".

    ``answer`` True: ``path`` runs from D to M. False: ``searched`` is every dataset upstream of M, so the
    negative can be checked; ``notes`` say when D or M's runs were never seen in any event."""

    model: str
    dataset: str
    answer: bool
    path: tuple[PathStep, ...]
    searched: tuple[str, ...]
    notes: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {"model": self.model, "dataset": self.dataset, "answer": self.answer, "path": [s.to_dict() for s in self.path],
                "text": render_path(self.path) if self.path else None, "searched": list(self.searched), "notes": list(self.notes)}


def did_ingest(graph: LineageGraph, model: ModelEntry, dataset: DatasetRef) -> IngestAnswer:
    """If anything derived from D is upstream of M, so is D (through the derivation), so the question
    reduces to membership of D in M's upstream closure, whose path is the proof."""
    notes = []
    known_runs = graph.run_closure(training_runs(graph, model))
    if not known_runs:
        notes.append(f"none of {model.node_id}'s training runs appears in any lineage event")
    if dataset not in graph.datasets:
        notes.append(f"{dataset.node_id} appears in no lineage event")
    found = graph.upstream(training_runs(graph, model), (_model_step(model),))
    if dataset in found:
        return IngestAnswer(model.node_id, dataset.node_id, True, found[dataset], tuple(sorted(d.node_id for d in found)), tuple(notes))
    return IngestAnswer(model.node_id, dataset.node_id, False, (), tuple(sorted(d.node_id for d in found)), tuple(notes))


# --- governance attributes that propagate -----------------------------------------------------------


@dataclass(frozen=True)
class Taint:
    """A governance attribute inherited from ``source``: kind is ``personal_data``,
    ``special_category`` (GDPR Art. 9), ``quarantined`` or ``license``; ``detail`` the reason or licence."""

    kind: str
    source: DatasetRef
    detail: str | None
    path: tuple[PathStep, ...]

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "source": self.source.node_id, "detail": self.detail,
                "path": [s.to_dict() for s in self.path], "text": render_path(self.path)}


def _attrs(e: DatasetEntry) -> list[tuple[str, str | None]]:
    out: list[tuple[str, str | None]] = []
    if e.contains_personal_data:
        out.append(("personal_data", e.legal_basis))
    if e.special_category_data:
        out.append(("special_category", e.art9_condition))
    if e.quarantined:
        out.append(("quarantined", e.quarantine_reason))
    if e.license:
        out.append(("license", e.license))
    return out


def propagate(graph: LineageGraph, registry: Iterable[DatasetEntry], models: Iterable[ModelEntry] = ()) -> dict[str, list[Taint]]:
    """Node id (``dataset:...`` or ``model:...``) -> the attributes it inherits from upstream datasets,
    each with its path. A dataset's own attributes are included (path of length one).

    Derived data stays personal data unless shown otherwise (anonymisation must be demonstrated,
    GDPR Recital 26), and a quarantine must reach everything built from the quarantined data, so
    propagation is conservative: every output of a run inherits every attribute of every input.
    """
    out: dict[str, list[Taint]] = {}
    models = list(models)
    model_runs_ = {m.node_id: graph.run_closure(training_runs(graph, m)) for m in models}
    for entry in registry:
        attrs = _attrs(entry)
        if not attrs:
            continue
        src = DatasetRef(entry.namespace, entry.name)
        ds_paths, run_paths = graph.downstream(src) if src in graph.datasets else ({src: (graph._ds_step(src),)}, {})
        for ds, path in ds_paths.items():
            for kind, detail in attrs:
                out.setdefault(ds.node_id, []).append(Taint(kind, src, detail, path))
        for m in models:
            hits = [(run_paths[r], tail) for r, tail in model_runs_[m.node_id].items() if r in run_paths]
            if hits:
                head, tail = min(hits, key=lambda h: len(h[0]) + len(h[1]))
                path = (*head, *tail[1:], _model_step(m))
                for kind, detail in attrs:
                    out.setdefault(m.node_id, []).append(Taint(kind, src, detail, path))
    return out


# --- column lineage ------------------------------------------------------------------------------


def column_upstream(columns: Iterable[ColumnEdge], dataset: DatasetRef, column: str) -> list[tuple[DatasetRef, str, tuple[str, ...]]]:
    """Input columns ``dataset.column`` is computed from, transitively: ``(dataset, column, path)`` where
    ``path`` lists ``namespace:name.column`` from the found column to the asked one. Dataset-wide
    dependencies (``output_field == ""``: filters, join keys) count for every column."""
    by_out: dict[tuple[DatasetRef, str], list[ColumnEdge]] = {}
    for c in columns:
        by_out.setdefault((c.output, c.output_field), []).append(c)

    def label(d: DatasetRef, f: str) -> str:
        return f"{d.namespace}:{d.name}.{f}"

    start = (dataset, column)
    paths: dict[tuple[DatasetRef, str], tuple[str, ...]] = {start: (label(dataset, column),)}
    queue: deque[tuple[DatasetRef, str]] = deque([start])
    while queue:
        cur = queue.popleft()
        for c in by_out.get(cur, []) + by_out.get((cur[0], ""), []):
            nxt = (c.input, c.input_field)
            if nxt not in paths:
                paths[nxt] = (label(*nxt), *paths[cur])
                queue.append(nxt)
    del paths[start]
    return sorted(((d, f, p) for (d, f), p in paths.items()), key=lambda x: (len(x[2]), x[0], x[1]))


def to_json(value: Any) -> str:
    """JSON text of facets for the store's text columns (sorted keys: equal facets, equal text)."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
