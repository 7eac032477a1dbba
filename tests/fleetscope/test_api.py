"""The HTTP API, served by a real uvicorn server on loopback, over SQLite and PostgreSQL."""

import gzip
import json
from pathlib import Path

import httpx
import pytest

from fleetscope.services import auth

T = "2026-03-01T12:00:00Z"


def token(api, *scopes: str) -> dict[str, str]:
    return {"Authorization": "Bearer " + auth.create_token(api.app.state.store.engine, "test", list(scopes))}


def gpu_batch(n: int = 3, power: float = 300.0) -> dict:
    return {
        "source": "test",
        "frames": {
            "gpu": [{"gpu_uuid": f"GPU-{i}", "host": "node-1", "gpu_index": i} for i in range(n)],
            "gpu_sample": [{"ts": T, "gpu_uuid": f"GPU-{i}", "power_w": power + i, "temp_c": 60} for i in range(n)],
        },
    }


def counts(api) -> dict[str, int]:
    return api.app.state.store.counts()


def test_healthz_needs_no_token_and_tells_the_schema_only_to_a_reader(api):
    r = httpx.get(api.url + "/healthz")
    assert (r.status_code, r.json()) == (200, {"status": "ok"})
    assert httpx.get(api.url + "/healthz", headers={"Authorization": "Bearer fs_guess"}).json() == {"status": "ok"}
    assert httpx.get(api.url + "/healthz", headers=token(api, "ingest")).json() == {"status": "ok"}
    body = httpx.get(api.url + "/healthz", headers=token(api, "read")).json()
    assert body["status"] == "ok" and body["schema"] == body["schema_head"] and body["reachable"] is True
    assert body["schema"] == sorted(p.name[:4] for p in (Path(__file__).resolve().parents[2] / "migrations" / "versions").glob("0*.py"))[-1]


def test_openapi_is_served(api):
    spec = httpx.get(api.url + "/openapi.json").json()
    assert "/api/v1/batches" in spec["paths"] and "/metrics" in spec["paths"]


def test_ingest_then_read_back(api):
    h = {**token(api, "ingest", "read")}
    r = httpx.post(api.url + "/api/v1/batches", json=gpu_batch(), headers=h)
    assert r.status_code == 200, r.text
    assert r.json()["written"] == {"gpu": 3, "gpu_sample": 3}
    assert r.json()["values"] == 6
    rows = httpx.get(api.url + "/api/v1/frames/gpu_sample", params={"gpu_uuid": ["GPU-0", "GPU-2"]}, headers=h).json()
    assert [(row["gpu_uuid"], row["power_w"], row["ts"]) for row in rows] == [("GPU-0", 300.0, "2026-03-01T12:00:00+00:00"), ("GPU-2", 302.0, "2026-03-01T12:00:00+00:00")]


def test_resent_batch_writes_nothing_new(api):
    h = token(api, "ingest")
    httpx.post(api.url + "/api/v1/batches", json=gpu_batch(), headers=h)
    r = httpx.post(api.url + "/api/v1/batches", json=gpu_batch(), headers=h)
    assert r.json()["written"]["gpu_sample"] == 0
    assert counts(api)["gpu_sample"] == 3


@pytest.mark.parametrize(
    ("headers", "status"),
    [({}, 401), ({"Authorization": "Bearer fs_not-a-real-token"}, 401), ({"Authorization": "Basic dXNlcjpwYXNz"}, 401)],
)
def test_without_a_valid_token_nothing_is_written(api, headers, status):
    r = httpx.post(api.url + "/api/v1/batches", json=gpu_batch(), headers=headers)
    assert r.status_code == status
    assert r.headers["www-authenticate"].startswith("Bearer")
    assert counts(api)["gpu_sample"] == 0


def test_wrong_scope_is_403_and_changes_nothing(api):
    r = httpx.post(api.url + "/api/v1/batches", json=gpu_batch(), headers=token(api, "read"))
    assert r.status_code == 403 and "ingest" in r.json()["detail"]
    assert counts(api)["gpu_sample"] == 0
    assert httpx.get(api.url + "/api/v1/counts", headers=token(api, "ingest")).status_code == 403
    assert httpx.get(api.url + "/metrics", headers=token(api, "governance")).status_code == 403


def test_admin_scope_admits_everything(api):
    h = token(api, "admin")
    assert httpx.post(api.url + "/api/v1/batches", json=gpu_batch(), headers=h).status_code == 200
    assert httpx.get(api.url + "/api/v1/counts", headers=h).json()["gpu_sample"] == 3


def test_revoked_token_is_refused(api):
    engine = api.app.state.store.engine
    secret = auth.create_token(engine, "temp", ["read"])
    h = {"Authorization": f"Bearer {secret}"}
    assert httpx.get(api.url + "/api/v1/counts", headers=h).status_code == 200
    (tid,) = [t["token_id"] for t in auth.list_tokens(engine) if t["name"] == "temp"]
    assert auth.revoke_token(engine, tid)
    assert httpx.get(api.url + "/api/v1/counts", headers=h).status_code == 401


def test_one_bad_row_rejects_the_batch_naming_row_and_field(api):
    h = token(api, "ingest")
    body = gpu_batch(5)
    body["frames"]["gpu_sample"][3]["power_w"] = "lots"
    r = httpx.post(api.url + "/api/v1/batches", json=body, headers=h)
    assert r.status_code == 422
    assert r.json() | {"detail": None} == {"detail": None, "frame": "gpu_sample", "row": 3, "field": "power_w"}
    assert "'lots' is not a number" in r.json()["detail"]
    assert counts(api)["gpu"] == 0 and counts(api)["gpu_sample"] == 0


def test_missing_key_is_named(api):
    body = gpu_batch(2)
    del body["frames"]["gpu_sample"][1]["gpu_uuid"]
    r = httpx.post(api.url + "/api/v1/batches", json=body, headers=token(api, "ingest"))
    assert (r.status_code, r.json()["row"], r.json()["field"]) == (422, 1, "gpu_uuid")
    assert counts(api)["gpu_sample"] == 0


@pytest.mark.parametrize(
    ("content", "words"),
    [
        (b"", "empty body"),
        (b'{"frames": {"gpu_sample": [', "malformed JSON at line 1"),
        (gzip.compress(b"\x00\xff" * 100, mtime=0), "not UTF-8"),
        (b"[1, 2, 3]", "expected {"),
        (b'{"frames": {"gpus": []}}', "unknown frame 'gpus'"),
        (b'{"frames": {"gpu_sample": {"ts": 1}}}', "must be a list"),
        (b"[" * 100_000 + b"]" * 100_000, "nested deeper than 64 levels"),
        (b"[" * 65 + b"]" * 65, "nested deeper than 64 levels"),
        (b'{"source": 5, "frames": {}}', "source must be a string"),
    ],
)
def test_hostile_bodies_get_400_and_change_nothing(api, content, words):
    r = httpx.post(api.url + "/api/v1/batches", content=content, headers={**token(api, "ingest"), "Content-Type": "application/json"})
    assert r.status_code == 400, r.text
    assert words in r.json()["detail"]
    assert sum(counts(api).values()) == 0


def test_oversized_body_is_413_by_length_and_by_stream(api):
    h = {**token(api, "ingest"), "Content-Type": "application/json"}
    big = json.dumps(gpu_batch()).encode() + b" " * (2**20 + 1)
    assert httpx.post(api.url + "/api/v1/batches", content=big, headers=h).status_code == 413

    def chunks():
        for _ in range(40):
            yield b" " * 65536

    r = httpx.post(api.url + "/api/v1/batches", content=chunks(), headers=h)
    assert r.status_code == 413 and "FLEETSCOPE_MAX_BODY_BYTES" in r.json()["detail"]
    assert sum(counts(api).values()) == 0


def test_read_endpoint_validates_its_query(api):
    h = token(api, "read")
    assert httpx.get(api.url + "/api/v1/frames/nope", headers=h).status_code == 404
    assert httpx.get(api.url + "/api/v1/frames/health_event", params={"job_id": "j"}, headers=h).status_code == 400
    assert httpx.get(api.url + "/api/v1/frames/gpu_sample", params={"start": "2026-03-02T00:00:00Z", "end": "2026-03-01T00:00:00Z"}, headers=h).status_code == 400
    assert httpx.get(api.url + "/api/v1/frames/gpu_sample", params={"start": "not a time"}, headers=h).status_code == 422
    assert httpx.get(api.url + "/api/v1/frames/gpu_sample", params={"limit": 10**9}, headers=h).status_code == 422
    r = httpx.get(api.url + "/api/v1/frames/gpu_sample", params={"gpu_uuid": "x' OR '1'='1"}, headers=h)
    assert r.status_code == 200 and r.json() == []


def test_metrics_expose_own_counters(api):
    h = token(api, "ingest", "read")
    httpx.post(api.url + "/api/v1/batches", json=gpu_batch(4), headers=h)
    text = httpx.get(api.url + "/metrics", headers=h).text
    assert 'fleetscope_rows_written_total{frame="gpu_sample"}' in text
    assert 'fleetscope_http_request_duration_seconds_count{method="POST",route="/api/v1/batches",status="200"}' in text
    assert "fleetscope_task_runs_total" in text or "# TYPE fleetscope_task_runs counter" in text


def test_a_token_is_verified_without_waiting_on_a_busy_writer(store, db_url):
    """``last_used_at`` is written at most once a minute, and only if the database takes the write at once: while
    another connection holds SQLite's write lock (a large ingest) or the token's row, a token is still verified in
    well under the busy timeout, and its use is recorded once the writer is done."""
    import time as _time

    from sqlalchemy import select, text

    from fleetscope.store import schema

    engine = store.engine
    secret = auth.create_token(engine, "agent", ["ingest"])
    holder = engine.connect()
    try:
        if store.dialect == "sqlite":
            holder.exec_driver_sql("BEGIN IMMEDIATE")  # the file's write lock, as a writer holds it
        else:
            holder.execute(text("SELECT 1 FROM api_token FOR UPDATE"))
        auth._cache.clear()
        t0 = _time.monotonic()
        assert auth.verify(engine, secret) is not None
        assert _time.monotonic() - t0 < 2
    finally:
        holder.rollback()
        holder.close()

    def used() -> object:
        with engine.connect() as conn:
            return conn.execute(select(schema.api_token.c.last_used_at).where(schema.api_token.c.name == "agent")).scalar_one()

    assert used() is None  # not recorded while the writer held on
    auth._cache.clear()
    assert auth.verify(engine, secret) is not None and used() is not None
    first = used()
    auth._cache.clear()
    assert auth.verify(engine, secret) is not None and used() == first  # within the minute: not written again
