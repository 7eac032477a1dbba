"""Governance through the running API: OpenLineage intake (real events, the official client), the
registry, lineage questions with a quarantined dataset two hops upstream, COMPAS fairness by upload."""

import io
import json
import os
import uuid

import httpx
import polars as pl
import pytest

from fleetscope.services import auth
from tests import clirun

EVENTS = "openlineage/events"


def gov(api):
    return {"Authorization": "Bearer " + auth.create_token(api.app.state.store.engine, "gov", ["governance"])}


def run_event(run_id, job, inputs, outputs, t, event_type="COMPLETE", facets=None):
    return {"eventType": event_type, "eventTime": t, "producer": "https://example.com/trainer", "schemaURL": "https://openlineage.io/spec/2-0-2/OpenLineage.json#/$defs/RunEvent",
            "run": {"runId": run_id, "facets": facets or {}}, "job": {"namespace": "lake", "name": job},
            "inputs": [{"namespace": "lake", "name": n} for n in inputs], "outputs": [{"namespace": "lake", "name": n} for n in outputs]}


def build_pipeline(api, h):
    """raw (quarantined) --clean--> clean --featurize--> features --train--> model ranker:1."""
    runs = {name: str(uuid.uuid4()) for name in ("clean", "featurize", "train")}
    posts = [
        run_event(runs["clean"], "clean", ["raw"], ["clean"], "2026-01-01T00:00:00Z"),
        run_event(runs["featurize"], "featurize", ["clean"], ["features"], "2026-01-02T00:00:00Z"),
        run_event(runs["train"], "train", ["features"], ["ranker-weights"], "2026-01-03T00:00:00Z",
                  facets={"fleetscope_job": {"_producer": "https://example.com", "_schemaURL": "https://fleetscope.dev/spec/facets/1-0-0/FleetscopeJobRunFacet.json", "jobId": "slurm-42"}}),
    ]
    for ev in posts:
        r = httpx.post(api.url + "/api/v1/lineage", json=ev, headers=h)
        assert r.status_code == 201, r.text
    assert httpx.put(api.url + "/api/v1/datasets", json={"namespace": "lake", "name": "raw", "contains_personal_data": True, "legal_basis": "consent",
                     "quarantined": True, "quarantine_reason": "consent withdrawn"}, headers=h).status_code == 200
    r = httpx.put(api.url + "/api/v1/models/ranker/1", json={"intended_purpose": "rank job applicants", "role": "provider", "training_run_ids": [runs["train"]]}, headers=h)
    assert r.status_code == 200, r.text
    return runs


def test_real_openlineage_events_are_accepted_once(api, realdata):
    h = gov(api)
    files = sorted((realdata / EVENTS).glob("*.json"))
    for f in files:
        r = httpx.post(api.url + "/api/v1/lineage", content=f.read_bytes(), headers={**h, "Content-Type": "application/json"})
        assert r.status_code == 201, (f.name, r.text)
    store = api.app.state.store
    assert store.read("lineage_event").height == len(files)
    for f in files:  # re-sent: nothing new
        httpx.post(api.url + "/api/v1/lineage", content=f.read_bytes(), headers={**h, "Content-Type": "application/json"})
    assert store.read("lineage_event").height == len(files)


@pytest.mark.parametrize(
    ("body", "status", "path"),
    [
        (b'{"eventTime": ', 400, None),
        (json.dumps({"eventTime": "2026-01-01T00:00:00Z", "producer": "p", "schemaURL": "s", "run": {"runId": "not-a-uuid"}, "job": {"namespace": "n", "name": "j"}}).encode(), 422, "/run/runId"),
        (json.dumps({"producer": "p", "schemaURL": "s", "run": {"runId": str(uuid.uuid4())}, "job": {"namespace": "n", "name": "j"}}).encode(), 422, None),
        (b"[" * 5000 + b"]" * 5000, 400, None),
        (b"\xff\xfe\x00", 400, None),
    ],
    ids=["truncated", "bad-run-id", "no-event-time", "deep-nesting", "binary"],
)
def test_invalid_events_are_refused_and_nothing_is_stored(api, body, status, path):
    r = httpx.post(api.url + "/api/v1/lineage", content=body, headers={**gov(api), "Content-Type": "application/json"})
    assert r.status_code == status, r.text
    if path:
        assert r.json()["path"] == path
    assert api.app.state.store.read("lineage_event").height == 0


def test_lineage_questions_and_taint(api):
    h = gov(api)
    build_pipeline(api, h)
    show = httpx.get(api.url + "/api/v1/models/ranker/lineage", headers=h).json()
    assert [u["dataset"] for u in show["upstream"]] == ["dataset:lake:features", "dataset:lake:clean", "dataset:lake:raw"]
    raw = show["upstream"][2]
    assert raw["hops"] == 3 and "raw" in raw["text"] and "ranker" in raw["text"]
    kinds = {(t["kind"], t["source"]) for t in show["taints"]}
    assert ("quarantined", "dataset:lake:raw") in kinds and ("personal_data", "dataset:lake:raw") in kinds
    yes = httpx.get(api.url + "/api/v1/models/ranker/ingested", params={"dataset": "raw"}, headers=h).json()
    assert yes["answer"] is True and [s for s in yes["path"]][0]["id"].endswith("raw")
    no = httpx.get(api.url + "/api/v1/models/ranker/ingested", params={"dataset": "elsewhere", "namespace": "lake"}, headers=h).json()
    assert no["answer"] is False and set(no["searched"]) == {"dataset:lake:features", "dataset:lake:clean", "dataset:lake:raw"}
    graph = httpx.get(api.url + "/api/v1/lineage", params={"nodeId": "job:lake:train", "depth": 5}, headers=h).json()["graph"]
    ids = [n["id"] for n in graph]
    assert "dataset:lake:raw" in ids and "job:lake:clean" in ids and ids == sorted(ids)
    assert httpx.get(api.url + "/api/v1/lineage", params={"nodeId": "job:lake:nope"}, headers=h).status_code == 404
    assert httpx.get(api.url + "/api/v1/models/nope/lineage", headers=h).status_code == 404


def test_registry_refuses_contradictions(api):
    h = gov(api)
    r = httpx.put(api.url + "/api/v1/datasets", json={"namespace": "lake", "name": "x", "special_category_data": True}, headers=h)
    assert r.status_code == 422 and "Art. 9" in r.json()["detail"]
    assert httpx.put(api.url + "/api/v1/datasets", json={"namespace": "lake", "name": "x", "quarantined": True}, headers=h).status_code == 422
    assert httpx.put(api.url + "/api/v1/datasets", json={"namespace": "lake", "name": "x", "colour": "red"}, headers=h).status_code == 422
    assert api.app.state.store.read("dataset_registry").height == 0


def test_governance_scope_is_required(api):
    read = {"Authorization": "Bearer " + auth.create_token(api.app.state.store.engine, "r", ["read", "ingest"])}
    assert httpx.get(api.url + "/api/v1/models", headers=read).status_code == 403
    assert httpx.post(api.url + "/api/v1/lineage", json={}, headers=read).status_code == 403
    assert httpx.get(api.url + "/api/v1/models").status_code == 401


def compas_csv(realdata) -> bytes:
    df = pl.read_csv(realdata / "compas/compas-7214-noPII.csv")
    out = df.select(pl.col("two_year_recid").alias("y_true"), pl.col("score_text").is_in(["Medium", "High"]).cast(pl.Int64).alias("y_pred"), "race", "sex")
    buf = io.BytesIO()
    out.write_csv(buf)
    return buf.getvalue()


def test_compas_fairness_by_upload_stores_only_aggregates(api, realdata):
    h = gov(api)
    httpx.put(api.url + "/api/v1/models/compas/1", json={"intended_purpose": "recidivism risk", "role": "deployer"}, headers=h)
    r = httpx.post(api.url + "/api/v1/models/compas/fairness", params={"sensitive": "race"}, content=compas_csv(realdata),
                   headers={**h, "Content-Type": "text/csv"}, timeout=120)
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["passed"] is False and body["result"]["n"] == 7214
    groups = api.app.state.store.read("fairness_group")
    black = groups.filter((pl.col("feature") == "race") & (pl.col("group_value") == "African-American")).row(0, named=True)
    white = groups.filter((pl.col("feature") == "race") & (pl.col("group_value") == "Caucasian")).row(0, named=True)
    # ProPublica's published error rates
    assert (round(100 * black["fpr"], 2), round(100 * white["fpr"], 2)) == (44.85, 23.45)
    assert (round(100 * black["fnr"], 2), round(100 * white["fnr"], 2)) == (27.99, 47.72)
    assert "y_true" not in api.app.state.store.read("fairness_evaluation").columns
    listed = httpx.get(api.url + "/api/v1/models/compas/fairness", headers=h).json()
    assert len(listed) == 1 and listed[0]["n_rows"] == 7214 and listed[0]["passed"] is False


@pytest.mark.parametrize(
    ("params", "content", "status", "words"),
    [
        ({"sensitive": "race"}, b"", 400, "empty body"),
        ({"sensitive": "zodiac"}, b"y_true,y_pred,race\n1,1,a\n0,1,b\n", 422, "zodiac"),
        ({"sensitive": "race"}, b"y_true,y_pred,race\n2,1,a\n0,1,b\n", 422, "y_true"),
        ({"sensitive": "race"}, b"\x00\x01garbage", 422, ""),
    ],
    ids=["empty", "missing-column", "non-binary", "garbage"],
)
def test_bad_fairness_uploads(api, params, content, status, words):
    h = gov(api)
    httpx.put(api.url + "/api/v1/models/m/1", json={}, headers=h)
    r = httpx.post(api.url + "/api/v1/models/m/fairness", params=params, content=content, headers=h)
    assert r.status_code == status, r.text
    assert words in r.json()["detail"]
    assert api.app.state.store.read("fairness_evaluation").height == 0


def test_openlineage_client_http_transport_against_the_service(api):
    client_mod = pytest.importorskip("openlineage.client", reason="openlineage-python (dev dependency) is not installed")
    from openlineage.client.event_v2 import Job, Run, RunEvent, RunState
    from openlineage.client.transport.http import ApiKeyTokenProvider, HttpConfig, HttpTransport

    secret = auth.create_token(api.app.state.store.engine, "ol", ["governance"])
    config = HttpConfig(url=api.url, endpoint="api/v1/lineage", auth=ApiKeyTokenProvider({"apiKey": secret}), retry={"total": 0})
    client = client_mod.OpenLineageClient(transport=HttpTransport(config))
    run_id = str(uuid.uuid4())
    client.emit(RunEvent(eventType=RunState.START, eventTime="2026-02-01T00:00:00+00:00", run=Run(runId=run_id), job=Job(namespace="train", name="m"),
                         inputs=[], outputs=[]))
    rows = api.app.state.store.read("lineage_run_event")
    assert rows["run_id"].to_list() == [run_id] and rows["event_type"].to_list() == ["START"]


def test_cli_lineage_and_fairness(api, tmp_path, realdata):
    # the CLI works on the same database the API writes
    h = gov(api)
    build_pipeline(api, h)
    url = str(api.app.state.store.engine.url.render_as_string(hide_password=False))
    env = {**os.environ, "FLEETSCOPE_DATA_DIR": str(tmp_path), "FLEETSCOPE_DATABASE_URL": url}
    run = lambda *a: clirun.cli(*a, env=env)  # noqa: E731
    show = run("governance", "lineage", "show", "ranker")
    assert show.returncode == 0, show.stderr
    assert "dataset:lake:raw" in show.stdout and "TAINT quarantined" in show.stdout
    check = run("governance", "lineage", "check", "ranker", "--dataset", "raw")
    assert check.returncode == 3 and check.stdout.startswith("YES")
    assert run("governance", "lineage", "check", "ranker", "--dataset", "nowhere", "--namespace", "lake").returncode == 0
    csv = tmp_path / "compas.csv"
    csv.write_bytes(compas_csv(realdata))
    assert run("governance", "registry", "model", "compas", "2", "--purpose", "risk", "--role", "deployer").returncode == 0
    fair = run("governance", "fairness", "evaluate", str(csv), "--model", "compas", "--sensitive", "race")
    assert fair.returncode == 4 and "FAILED" in fair.stdout
    bad = run("governance", "registry", "dataset", "lake", "x", "--special-category")
    assert bad.returncode == 1 and "Art. 9" in bad.stderr


def test_column_lineage_from_the_real_facet(api, realdata):
    h = gov(api)
    # the real event, with OpenLineage's own ColumnLineageDatasetFacet example on its output
    ev = json.loads((realdata / EVENTS / "03_run_complete_full_facets.json").read_text())
    ev["outputs"][0]["facets"].update(json.loads((realdata / "openlineage/facets/ColumnLineageDatasetFacet.1.json").read_text()))
    r = httpx.post(api.url + "/api/v1/lineage", json=ev, headers=h)
    assert r.status_code == 201, r.text
    out = ev["outputs"][0]
    facet = out["facets"]["columnLineage"]["fields"]
    column, spec = next(iter(facet.items()))
    r = httpx.get(api.url + "/api/v1/lineage/column", params={"namespace": out["namespace"], "name": out["name"], "column": column}, headers=h).json()
    want = {(f"dataset:{i['namespace']}:{i['name']}", i["field"]) for i in spec["inputFields"]}
    assert want <= {(u["dataset"], u["column"]) for u in r["upstream"]}


def test_fairness_upload_is_discarded_unless_kept(api, realdata):
    h = gov(api)
    httpx.put(api.url + "/api/v1/models/compas/1", json={"intended_purpose": "risk", "role": "deployer"}, headers=h)
    csv = compas_csv(realdata)
    r = httpx.post(api.url + "/api/v1/models/compas/fairness", params={"sensitive": "race"}, content=csv, headers=h, timeout=120).json()
    assert r["upload_kept_at"] is None
    uploads = api.app.state.settings.data_dir / "fairness-uploads"
    assert not uploads.exists()
    r = httpx.post(api.url + "/api/v1/models/compas/fairness", params={"sensitive": "race", "keep_upload": "true"}, content=csv, headers=h, timeout=120).json()
    kept = list(uploads.iterdir())
    assert len(kept) == 1 and kept[0].read_bytes() == csv and r["upload_kept_at"] == str(kept[0])


@pytest.mark.parametrize("body", [b'{"namespace": NaN, "name": "d"}', b'{"namespace": "s3", "name": Infinity}',
                                  b'{"namespace": "s3", "name": "d", "quarantined": -Infinity}'])
def test_a_body_with_nan_gets_422_naming_the_field_not_500(api, body):
    h = gov(api)
    # Python's JSON reader accepts the bare NaN/Infinity tokens; echoing them back in the 422 body is not
    # valid JSON, which made the framework's default handler fail with a 500.
    r = httpx.put(api.url + "/api/v1/datasets", content=body, headers={**h, "Content-Type": "application/json"})
    assert r.status_code == 422, r.text
    detail = r.json()["detail"]
    assert detail and all("input" not in d for d in detail)
    assert detail[0]["loc"][:1] == ["body"] and detail[0]["loc"][1] in ("namespace", "name", "quarantined")
    assert httpx.get(api.url + "/api/v1/datasets", headers=h).json() == []
