"""A deployed model's predictions and outcomes through the ingest door (format ``model_monitoring``): the
library call, ``POST /api/v1/ingest/model_monitoring`` and ``fleetscope ingest`` write them in one
transaction; malformed, truncated, oversized and hostile input is refused with the line and field named,
and changes nothing."""

import datetime as dt
import gzip
import json
import os

import httpx
import pytest

from fleetscope.core.errors import ParseError
from fleetscope.door import ingestion
from fleetscope.services import auth
from tests import clirun

T0 = dt.datetime(2026, 8, 3, 10, tzinfo=dt.UTC)


def pred(i, **kw):
    row = {"model": "credit", "version": "1", "prediction_id": f"p{i}", "ts": (T0 + dt.timedelta(minutes=i)).isoformat(),
           "score": round(0.1 + 0.8 * (i % 10) / 9, 4), "features": {"income": 30000.0 + 1000 * i, "age": 20 + i % 50},
           "groups": {"sex": "F" if i % 2 else "M"}}
    row.update(kw)
    return json.dumps({k: v for k, v in row.items() if v is not ...})


def outcome(i, value, **kw):
    row = {"type": "outcome", "model": "credit", "version": "1", "prediction_id": f"p{i}",
           "ts": (T0 + dt.timedelta(days=30, minutes=i)).isoformat(), "outcome": value}
    row.update(kw)
    return json.dumps(row)


def body(lines):
    return ("\n".join(lines) + "\n").encode()


GOOD = body([pred(i) for i in range(20)] + [outcome(i, i % 2) for i in range(0, 20, 2)])


def held(store):
    return store.read("model_prediction").height, store.read("model_outcome").height


def test_predictions_and_outcomes_are_written_once(store):
    out = ingestion.ingest_bytes(store, GOOD, source="credit.jsonl")
    assert out.formats == ["model_monitoring"]  # found by content
    assert out.result.written == {"model_prediction": 20, "model_outcome": 10}
    p = store.read("model_prediction")
    row = p.filter(p["prediction_id"] == "p3").row(0, named=True)
    assert row["score"] == pytest.approx(0.1 + 0.8 * 3 / 9, abs=1e-4) and json.loads(row["features"]) == {"age": 23.0, "income": 33000.0}
    assert ingestion.ingest_bytes(store, GOOD, source="credit.jsonl").skipped_duplicate
    assert held(store) == (20, 10)
    # an outcome corrected later replaces the earlier one; a prediction re-sent stays one row
    ingestion.ingest_bytes(store, body([pred(0), outcome(0, 1)]), source="fix.jsonl", fmt="model_monitoring")
    o = store.read("model_outcome")
    assert held(store) == (20, 10) and o.filter(o["prediction_id"] == "p0")["outcome"].to_list() == [1.0]


def test_gzip_body_is_read(store):
    ingestion.ingest_bytes(store, gzip.compress(GOOD), source="credit.jsonl.gz", fmt="model_monitoring")
    assert held(store) == (20, 10)


@pytest.mark.parametrize(("data", "line", "field", "words"), [
    (body([pred(0), '{"model": "credit", "version": "1"']), 2, None, "truncated"),  # truncated in the middle of an object
    (GOOD[:-40], 30, None, "truncated"),  # cut mid-line at the end
    (body([pred(0), "not json"]), 2, None, "JSON"),
    (body([pred(0), pred(1, score=1.5)]), 2, "score", "[0, 1]"),
    (body([pred(0), pred(1, featurs={"a": 1})]), 2, "featurs", "unknown field"),
    (body([pred(0), pred(1, ts="2026-08-03 10:00:00")]), 2, "ts", "zone"),
    (body([pred(0), pred(0, score=0.9)]), 2, "prediction_id", "repeated with different content"),
    (body([pred(0), outcome(0, None)]), 2, "outcome", "missing"),
    (body([pred(0), pred(1, features={f"f{i}": 1.0 for i in range(300)})]), 2, "features", "at most 256"),
    (body([pred(0), pred(1, model="x" * 300)]), 2, "model", "1-256"),
])
def test_bad_input_is_refused_naming_line_and_field_and_changes_nothing(store, data, line, field, words):
    with pytest.raises(ParseError) as e:
        ingestion.ingest_bytes(store, data, source="bad.jsonl", fmt="model_monitoring")
    assert words in str(e.value) and e.value.line == line and e.value.field == field, str(e.value)
    assert held(store) == (0, 0)


@pytest.mark.parametrize(("data", "words"), [
    (body([pred(0)]).replace(b"credit", b"cre\x00dit", 1), "NUL"),
    (body([pred(0)]) + b"\xff\xfe\n", "UTF-8"),
    (b'{"model": "c", "version": "1", "prediction_id": "p", "ts": 1, "score": 0.1, "features": ' + b"[" * 5000 + b"]" * 5000 + b"}\n", "nested too deeply"),
    (body([pred(0), json.dumps({"model": "c", "version": "1", "prediction_id": "p", "ts": 1, "score": 0.1, "x": "y" * (2 << 20)})]), "line"),
])
def test_hostile_input_is_refused(store, data, words):
    with pytest.raises(ParseError) as e:
        ingestion.ingest_bytes(store, data, source="hostile.jsonl", fmt="model_monitoring")
    assert words in str(e.value)
    assert held(store) == (0, 0)


def test_hostile_text_is_stored_verbatim_as_data(store):
    evil = "p1'); DROP TABLE model_prediction; --"
    ingestion.ingest_bytes(store, body([pred(1, prediction_id=evil, groups={"sex": "<script>alert(1)</script>"})]), source="e.jsonl")
    p = store.read("model_prediction")
    assert p["prediction_id"].to_list() == [evil] and json.loads(p["groups"][0]) == {"sex": "<script>alert(1)</script>"}


def _headers(api, scope):
    return {"Authorization": "Bearer " + auth.create_token(api.app.state.store.engine, scope, [scope])}


def test_api_ingest_and_its_refusals(api):
    store = api.app.state.store
    url = api.url + "/api/v1/ingest/model_monitoring"
    h = _headers(api, "ingest")
    assert httpx.post(url, content=GOOD, headers=_headers(api, "read")).status_code == 403
    r = httpx.post(url, content=GOOD[:-40], headers=h)
    assert r.status_code == 400 and r.json()["line"] == 30 and "truncated" in r.json()["detail"]
    assert httpx.post(url, content=body([pred(0)]) + b" " * (2**20 + 1), headers=h).status_code == 413
    late = (dt.datetime.now(dt.UTC) + dt.timedelta(days=2)).isoformat()
    r = httpx.post(url, content=body([pred(0), pred(1, ts=late)]), headers=h)
    assert r.status_code == 422 and r.json()["frame"] == "model_prediction" and "ahead of the server's clock" in r.json()["detail"], r.text
    assert held(store) == (0, 0)
    r = httpx.post(url, content=GOOD, headers=h)
    assert r.status_code == 200, r.text
    assert held(store) == (20, 10)
    # by content, through the generic route as well
    r = httpx.post(api.url + "/api/v1/ingest/auto", content=body([pred(50)]), headers=h)
    assert r.status_code == 200, r.text
    assert held(store) == (21, 10)


def test_cli_ingest(tmp_path):
    env = {**os.environ, "FLEETSCOPE_DATA_DIR": str(tmp_path)}
    env.pop("FLEETSCOPE_DATABASE_URL", None)
    good, bad = tmp_path / "credit.jsonl", tmp_path / "bad.jsonl"
    good.write_bytes(GOOD)
    bad.write_bytes(body([pred(0), pred(1, score=2)]))
    run = lambda *a: clirun.cli(*a, env=env)  # noqa: E731
    out = run("ingest", str(bad))
    assert out.returncode != 0 and "line 2" in out.stderr and "score" in out.stderr
    out = run("ingest", str(good))
    assert out.returncode == 0, out.stderr
    assert "model_prediction" in out.stdout
