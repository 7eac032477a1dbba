"""Lineage queries on a hand-built graph of OpenLineage events.

    lake:raw (quarantined, personal) --clean--> lake:clean --featurize--> lake:features --train--> model ranker:1
    lake:census (special category)  --featurize--^
    lake:unrelated --other--> lake:other
    lake:late_src --backfill (after training ended)--> lake:features

so raw is two runs upstream of the model, and late_src wrote into the model's input only after training.
"""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from governance import frames as GF
from governance import lineage as L
from governance import lineage_events
from governance.registry import DatasetEntry, ModelEntry

NS = "lake"
P = {"_producer": "https://example.org/test", "_schemaURL": "https://example.org/schema"}


def rid(name: str) -> str:
    return str(uuid.uuid5(uuid.NAMESPACE_URL, name))


def run_event(run: str, job: str, t: str, inputs: list[str], outputs: list[str], event_type: str = "COMPLETE",
              facets: dict[str, Any] | None = None, job_ns: str = "etl", ds_ns: str = NS) -> dict[str, Any]:
    return {
        "eventType": event_type, "eventTime": t, "producer": "https://example.org/test",
        "schemaURL": "https://openlineage.io/spec/2-0-2/OpenLineage.json#/$defs/RunEvent",
        "run": {"runId": rid(run), "facets": facets or {}},
        "job": {"namespace": job_ns, "name": job},
        "inputs": [{"namespace": ds_ns, "name": d} for d in inputs],
        "outputs": [{"namespace": ds_ns, "name": d} for d in outputs],
    }


def events() -> list[dict[str, Any]]:
    return [
        run_event("r1", "clean", "2025-01-01T00:00:00Z", ["raw"], ["clean"], "START"),
        run_event("r1", "clean", "2025-01-01T01:00:00Z", ["raw"], ["clean"]),
        run_event("r2", "featurize", "2025-01-02T00:00:00Z", ["clean", "census"], ["features"]),
        run_event("r3", "train", "2025-01-03T00:00:00Z", ["features"], ["ranker-weights"], "START",
                  facets={"fleetscope_job": {**P, "jobId": "slurm-881"}}),
        run_event("r3", "train", "2025-01-03T06:00:00Z", ["features"], ["ranker-weights"]),
        run_event("r4", "other", "2025-01-02T00:00:00Z", ["unrelated"], ["other"]),
        run_event("r5", "backfill", "2025-01-04T00:00:00Z", ["late_src"], ["features"]),
    ]


MODEL = ModelEntry("ranker", "1", "rank job applicants", "provider", (rid("r3"),))
REGISTRY = [
    DatasetEntry(NS, "raw", license="CC-BY-4.0", contains_personal_data=True, legal_basis="consent", consent_reference="c-1",
                 provenance="crm export", quarantined=True, quarantine_reason="consent withdrawn 2025-02-01"),
    DatasetEntry(NS, "census", contains_personal_data=True, special_category_data=True, legal_basis="public_task", art9_condition="art9_2_j"),
    DatasetEntry(NS, "unrelated", quarantined=True, quarantine_reason="scraped without licence"),
]


@pytest.fixture(scope="module")
def graph() -> L.LineageGraph:
    return L.LineageGraph.from_events(lineage_events.parse_event(e) for e in events())


def ds(name: str) -> L.DatasetRef:
    return L.DatasetRef(NS, name)


def test_upstream_datasets_with_paths(graph: L.LineageGraph) -> None:
    ups = L.upstream_datasets(graph, MODEL)
    assert [(u.dataset.name, u.hops) for u in ups] == [("features", 1), ("census", 2), ("clean", 2), ("raw", 3)]
    raw = ups[-1]
    assert L.render_path(raw.path) == (
        f"dataset:lake:raw -> run:{rid('r1')} (job etl/clean) -> dataset:lake:clean -> run:{rid('r2')} (job etl/featurize)"
        f" -> dataset:lake:features -> run:{rid('r3')} (job etl/train) -> model:ranker:1"
    )


def test_did_ingest_yes_with_path_two_hops_up(graph: L.LineageGraph) -> None:
    ans = L.did_ingest(graph, MODEL, ds("raw"))
    assert ans.answer is True
    assert ans.path[0].id == "dataset:lake:raw" and ans.path[-1].id == "model:ranker:1"
    assert [s.kind for s in ans.path] == ["dataset", "run", "dataset", "run", "dataset", "run", "model"]


def test_did_ingest_no_lists_what_was_searched(graph: L.LineageGraph) -> None:
    ans = L.did_ingest(graph, MODEL, ds("unrelated"))
    assert ans.answer is False and ans.path == ()
    assert ans.searched == ("dataset:lake:census", "dataset:lake:clean", "dataset:lake:features", "dataset:lake:raw")
    assert ans.notes == ()


def test_data_written_after_training_did_not_train_the_model(graph: L.LineageGraph) -> None:
    # late_src reached lake:features only on 2025-01-04, after training's last event on 2025-01-03.
    ans = L.did_ingest(graph, MODEL, ds("late_src"))
    assert ans.answer is False
    # A retrain after the backfill does see it.
    later = L.LineageGraph.from_events(lineage_events.parse_event(e) for e in [*events(), run_event("r6", "train", "2025-01-05T00:00:00Z", ["features"], ["w2"])])
    retrained = ModelEntry("ranker", "2", training_run_ids=(rid("r6"),))
    yes = L.did_ingest(later, retrained, ds("late_src"))
    assert yes.answer is True and yes.path[2].id == "dataset:lake:features"


def test_unknown_dataset_and_model_are_noted(graph: L.LineageGraph) -> None:
    ans = L.did_ingest(graph, ModelEntry("ghost", "0", training_run_ids=(rid("nope"),)), ds("never"))
    assert ans.answer is False and ans.searched == ()
    assert len(ans.notes) == 2 and "appears in no lineage event" in ans.notes[1]


def test_quarantine_and_personal_data_propagate_to_the_model(graph: L.LineageGraph) -> None:
    taints = L.propagate(graph, REGISTRY, [MODEL])
    model = {(t.kind, t.source.name, t.detail) for t in taints["model:ranker:1"]}
    assert model == {
        ("quarantined", "raw", "consent withdrawn 2025-02-01"),
        ("personal_data", "raw", "consent"),
        ("license", "raw", "CC-BY-4.0"),
        ("personal_data", "census", "public_task"),
        ("special_category", "census", "art9_2_j"),
    }
    q = next(t for t in taints["model:ranker:1"] if t.kind == "quarantined")
    assert q.path[0].id == "dataset:lake:raw" and q.path[-1].id == "model:ranker:1" and len(q.path) == 7
    assert {t.kind for t in taints["dataset:lake:features"]} >= {"quarantined", "special_category"}
    assert "dataset:lake:other" in taints and "dataset:lake:ranker-weights" in taints
    # Nothing from lake:unrelated reached the model, and the backfill's source is untainted.
    assert all(t.source.name != "unrelated" for t in taints["model:ranker:1"])
    assert "dataset:lake:late_src" not in taints


def test_propagation_agrees_with_did_ingest(graph: L.LineageGraph) -> None:
    taints = L.propagate(graph, REGISTRY, [MODEL])
    tainted_by = {t.source for t in taints.get("model:ranker:1", [])}
    for entry in REGISTRY:
        ref = L.DatasetRef(entry.namespace, entry.name)
        assert (ref in tainted_by) == L.did_ingest(graph, MODEL, ref).answer, ref


def test_model_linked_by_facet_and_child_runs() -> None:
    evs = [
        run_event("dag", "nightly", "2025-01-01T00:00:00Z", [], [], "START",
                  facets={"fleetscope_model": {**P, "name": "m", "version": "7"}}),
        run_event("task", "nightly.load", "2025-01-01T00:10:00Z", ["src"], ["stage"],
                  facets={"parent": {**P, "run": {"runId": rid("dag")}, "job": {"namespace": "etl", "name": "nightly"}}}),
        run_event("dag", "nightly", "2025-01-01T02:00:00Z", [], []),
    ]
    g = L.LineageGraph.from_events(lineage_events.parse_event(e) for e in evs)
    model = ModelEntry("m", "7")  # no run ids in the registry: the facet links it
    ans = L.did_ingest(g, model, ds("src"))
    assert ans.answer is True
    assert [s.id for s in ans.path] == ["dataset:lake:src", f"run:{rid('task')}", f"run:{rid('dag')}", "model:m:7"]


def _edges_consistent(graph: dict[str, Any]) -> None:
    ids = [n["id"] for n in graph["graph"]]
    assert ids == sorted(ids)
    by_id = {n["id"]: n for n in graph["graph"]}
    for n in graph["graph"]:
        for e in n["inEdges"]:
            assert e["destination"] == n["id"] and e in by_id[e["origin"]]["outEdges"]
        for e in n["outEdges"]:
            assert e["origin"] == n["id"] and e in by_id[e["destination"]]["inEdges"]


def test_marquez_graph_shape_and_depth(graph: L.LineageGraph) -> None:
    g0 = graph.marquez_graph("job:etl:featurize", depth=0)
    assert [n["id"] for n in g0["graph"]] == ["dataset:lake:census", "dataset:lake:clean", "dataset:lake:features", "job:etl:featurize"]
    _edges_consistent(g0)
    job = next(n for n in g0["graph"] if n["type"] == "JOB")
    assert job["inEdges"] == [{"origin": "dataset:lake:census", "destination": "job:etl:featurize"},
                              {"origin": "dataset:lake:clean", "destination": "job:etl:featurize"}]
    assert job["data"]["latestRun"]["state"] == "COMPLETED"
    g1 = graph.marquez_graph("job:etl:featurize", depth=1)
    assert {n["id"] for n in g1["graph"] if n["type"] == "JOB"} == {"job:etl:clean", "job:etl:featurize", "job:etl:train", "job:etl:backfill"}
    _edges_consistent(g1)
    full = graph.marquez_graph("dataset:lake:raw", depth=20, registry={L.DatasetRef(e.namespace, e.name): e for e in REGISTRY})
    raw = next(n for n in full["graph"] if n["id"] == "dataset:lake:raw")
    assert raw["data"]["governance"]["quarantined"] is True
    assert "job:etl:other" not in {n["id"] for n in full["graph"]}
    train = next(n for n in full["graph"] if n["id"] == "job:etl:train")
    assert train["data"]["latestRun"]["fleetJobId"] == "slurm-881"


def test_marquez_node_ids_with_colons_and_unknown_nodes() -> None:
    g = L.LineageGraph.from_events([lineage_events.parse_event(run_event("x", "load", "2025-01-01T00:00:00Z", ["public.users"], ["public.dim"],
                                                           ds_ns="postgres://db:5432"))])
    out = g.marquez_graph("dataset:postgres://db:5432:public.users", depth=1)
    assert "dataset:postgres://db:5432:public.dim" in {n["id"] for n in out["graph"]}
    for bad in ("dataset:postgres://db:5432:nope", "model:x:y", "job"):
        with pytest.raises(L.LineageNotFound):
            g.marquez_graph(bad)


def test_stored_frames_answer_the_same(graph: L.LineageGraph) -> None:
    fr = GF.lineage_frames(lineage_events.parse_event(e) for e in events())
    assert fr["lineage_io"].height == 15 and fr["lineage_run_event"].height == 7
    again = GF.graph_from_frames(fr["lineage_run_event"], fr["lineage_io"], fr["lineage_dataset"])
    assert [u.to_dict() for u in L.upstream_datasets(again, MODEL)] == [u.to_dict() for u in L.upstream_datasets(graph, MODEL)]
    assert again.marquez_graph("job:etl:train", 3) == graph.marquez_graph("job:etl:train", 3)
    reg = GF.registry_frames(REGISTRY, [MODEL])
    ds_back, models_back = GF.registry_from_frames(reg["dataset_registry"], reg["model"], reg["model_training_run"])
    assert ds_back == REGISTRY and models_back == [MODEL]


def test_column_lineage_upstream() -> None:
    out_facet = {"columnLineage": {**P, "fields": {
        "score": {"inputFields": [{"namespace": NS, "name": "features", "field": "f1", "transformations": [{"type": "DIRECT", "subtype": "TRANSFORMATION"}]}]},
    }, "dataset": [{"namespace": NS, "name": "features", "field": "region", "transformations": [{"type": "INDIRECT", "subtype": "FILTER"}]}]}}
    feat_facet = {"columnLineage": {**P, "fields": {
        "f1": {"inputFields": [{"namespace": NS, "name": "raw", "field": "email", "transformations": [{"type": "DIRECT", "subtype": "TRANSFORMATION", "masking": True}]}]},
    }}}
    e1 = run_event("a", "feat", "2025-01-01T00:00:00Z", ["raw"], ["features"])
    e1["outputs"][0]["facets"] = feat_facet
    e2 = run_event("b", "score", "2025-01-02T00:00:00Z", ["features"], ["scores"])
    e2["outputs"][0]["facets"] = out_facet
    cols = [c for e in (e1, e2) for c in lineage_events.parse_event(e).columns]
    assert any(c.masking is True for c in cols)
    up = L.column_upstream(cols, ds("scores"), "score")
    assert [(d.name, f) for d, f, _ in up] == [("features", "f1"), ("features", "region"), ("raw", "email")]
    assert up[-1][2] == ("lake:raw.email", "lake:features.f1", "lake:scores.score")
    fr = GF.lineage_frames(lineage_events.parse_event(e) for e in (e1, e2))
    assert GF.columns_from_frame(fr["lineage_column"]) == cols


def test_registry_refuses_contradictions() -> None:
    with pytest.raises(ValueError, match="Art. 9"):
        DatasetEntry(NS, "x", special_category_data=True)
    with pytest.raises(ValueError, match="reason"):
        DatasetEntry(NS, "x", quarantined=True)
    with pytest.raises(ValueError, match="legal_basis"):
        DatasetEntry(NS, "x", contains_personal_data=True, legal_basis="because")
    with pytest.raises(ValueError, match="role"):
        ModelEntry("m", "1", role="vendor")
    flagged = DatasetEntry(NS, "x", contains_personal_data=True, special_category_data=True, legal_basis="consent").issues()
    assert any("Art. 7(1)" in i for i in flagged) and any("prohibited" in i for i in flagged)


def test_governance_tables_do_not_collide_with_canonical_frames() -> None:
    from fleetscope.core.frames import FRAMES

    assert not set(GF.GOVERNANCE_FRAMES) & set(FRAMES)
    for spec in GF.GOVERNANCE_FRAMES.values():
        assert spec.key, spec.name  # every table has a natural key, so re-sent data is idempotent
        assert spec.empty().columns == list(spec.names)
