"""Alembic: upgrade to head, downgrade to base, and no drift between models and migrations."""

import datetime as dt
import json

import polars as pl
import pytest
from sqlalchemy import create_engine, inspect, text

from fleetscope.core import frames as F
from fleetscope.store import Store, db, partitions
from fleetscope.store import schema
from fleetscope.settings import load
from ingest import kineto


def _empty_url(request: pytest.FixtureRequest, tmp_path, kind: str) -> str:
    if kind == "sqlite":
        return f"sqlite:///{tmp_path / 'm.db'}"
    url = request.getfixturevalue("pg_url")
    db.downgrade(url, "base") if db.current_revision(create_engine(url)) else None
    return url


@pytest.mark.parametrize("kind", ["sqlite", "postgresql"])
def test_upgrade_head_no_drift_downgrade_base(request, tmp_path, kind):
    url = _empty_url(request, tmp_path, kind)
    db.upgrade(url)
    engine = db.make_engine(url)
    assert db.current_revision(engine) == db.head_revision(url)
    assert set(schema.metadata.tables) <= set(db.table_names(engine))
    assert db.schema_drift(engine) == []
    db.downgrade(url, "base")
    assert db.table_names(engine) == ["alembic_version"]
    assert db.current_revision(engine) is None
    db.upgrade(url)  # and back up again: downgrade left nothing behind that blocks it
    assert db.schema_drift(engine) == []
    engine.dispose()


@pytest.mark.parametrize("kind", ["sqlite", "postgresql"])
def test_0022_drops_the_series_key_of_metric_samples_and_keeps_their_rows(request, tmp_path, kind):
    url = _empty_url(request, tmp_path, kind)
    db.upgrade(url, "0021")

    def foreign_keys() -> list[str]:
        engine = db.make_engine(url)
        try:
            return [fk["referred_table"] for fk in inspect(engine).get_foreign_keys("metric_sample")]
        finally:
            engine.dispose()

    assert foreign_keys() == ["series"]
    t0 = dt.datetime(2026, 6, 1, tzinfo=dt.UTC)
    samples = pl.DataFrame({"ts": [t0, t0 + dt.timedelta(seconds=1)], "series": ['DCGM_FI_X{gpu_uuid="GPU-1"}'] * 2, "value": [1.5, 2.5]})
    store = Store.open(url)
    store.write(F.Batch(source="t", metric_sample=samples))
    store.engine.dispose()
    for revision, keys in (("head", []), ("0021", ["series"]), ("head", [])):
        (db.upgrade if revision == "head" else db.downgrade)(url, revision)
        assert foreign_keys() == keys
        store = Store.open(url)
        got = store.read("metric_sample")
        store.engine.dispose()
        assert got["value"].to_list() == [1.5, 2.5] and got["series"].to_list() == ['DCGM_FI_X{gpu_uuid="GPU-1"}'] * 2


def _small_trace() -> bytes:
    """One rank's Kineto trace: two profiler steps, a GEMM and an NCCL kernel launched in the first."""
    def x(name, ts, dur, cat="kernel", **args):  # type: ignore[no-untyped-def]
        return {"ph": "X", "cat": cat, "name": name, "pid": 0, "tid": 1, "ts": ts, "dur": dur, "args": args}
    events = [x("ProfilerStep#1", 1000, 100, cat="user_annotation"), x("ProfilerStep#2", 1100, 100, cat="user_annotation"),
              x("cudaLaunchKernel", 1001, 1, cat="cuda_runtime", correlation=1), x("cudaLaunchKernel", 1002, 1, cat="cuda_runtime", correlation=2),
              x("sm80_gemm", 1010, 40, stream=7, correlation=1), x("ncclDevKernel_AllReduce_Sum_f32", 1030, 40, stream=9, correlation=2)]
    return json.dumps({"distributedInfo": {"rank": 0, "world_size": 2}, "baseTimeNanoseconds": 1_700_000_000_000_000_000,
                       "traceEvents": events}).encode()


@pytest.mark.parametrize("kind", ["sqlite", "postgresql"])
def test_0031_adds_device_union_and_its_downgrade_leaves_the_other_kineto_frames(request, tmp_path, kind):
    url = _empty_url(request, tmp_path, kind)
    db.upgrade(url, "0030")

    def tables() -> set[str]:
        engine = db.make_engine(url)
        try:
            return set(db.table_names(engine))
        finally:
            engine.dispose()

    assert "device_union" not in tables()
    db.upgrade(url)
    assert "device_union" in tables()
    batch = kineto.parse(_small_trace(), job_id="j")
    store = Store.open(url)
    assert store.write(batch).written["device_union"] == 3
    got = store.read("device_union", job_id="j").sort("window")
    assert got["window"].to_list() == ["all", "before_last_step", "through_last_step"]
    assert got.filter(pl.col("window") == "before_last_step").select("span_us", "busy_us", "compute_us", "comm_us", "overlap_us").row(0) == (
        60.0, 60.0, 40.0, 40.0, 20.0)
    assert got["start"].to_list() == [dt.datetime(2023, 11, 14, 22, 13, 20, 1010, tzinfo=dt.UTC)] * 3
    store.engine.dispose()
    db.downgrade(url, "0030")
    assert "device_union" not in tables()
    store = Store.open(url)  # the trace's other frames stay
    assert store.read("step", job_id="j").height == 2 and store.read("collective", job_id="j").height == 1
    store.engine.dispose()
    db.upgrade(url)
    store = Store.open(url)
    assert store.read("device_union").height == 0  # nothing left behind; the trace ingested again fills it
    again = store.write(kineto.parse(_small_trace(), job_id="j")).written
    assert again.get("device_union") == 3 and again.get("step", 0) == 0
    store.engine.dispose()


def test_0024_orders_every_string_column_by_bytes_and_keeps_the_rows(pg_url):
    url = pg_url
    db.downgrade(url, "base") if db.current_revision(create_engine(url)) else None
    db.upgrade(url, "0023")
    t0 = dt.datetime(2026, 6, 1, tzinfo=dt.UTC)
    gpus = ["gpu-a", "GPU-b", "GPU-a", "GPU-\u00e9"]
    store = Store.open(url)
    store.write(F.Batch(source="t", metric_sample=pl.DataFrame({"ts": [t0], "series": ['DCGM_FI_X{gpu_uuid="GPU-1"}'], "value": [1.5]})))
    # the store writes raw samples in the head's shape (integer GPU ids, 0026); at 0023 they are rows of UUIDs.
    # The partitions this process made before the downgrade to base are gone: forget them, or ensure_days trusts them.
    partitions.forget_all(store.engine)
    partitions.ensure_days(store.engine, "gpu_sample", {t0.date()})
    with store.engine.begin() as conn:
        conn.execute(text("INSERT INTO gpu_sample (ts, gpu_uuid, power_w) SELECT :t, u, p FROM unnest(CAST(:g AS text[]), CAST(:p AS float8[])) AS x(u, p)"),
                     {"t": t0, "g": gpus, "p": [1.0, 2.0, 3.0, 4.0]})
    store.engine.dispose()

    def collations() -> dict[str, set]:
        engine = db.make_engine(url)
        try:
            with engine.connect() as conn:
                rows = conn.execute(text(
                    "SELECT c.relname, co.collname FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid"
                    " JOIN pg_collation co ON co.oid = a.attcollation WHERE a.attname IN ('gpu_uuid', 'series') AND a.attnum > 0"
                    " AND c.relkind IN ('r', 'p') AND c.relname LIKE ANY (ARRAY['gpu_sample%', 'series', 'counter_reading'])")).fetchall()
                drift = db.schema_drift(engine)
        finally:
            engine.dispose()
        return {"collations": {name for _, name in rows}, "tables": {t for t, _ in rows}, "drift": len(drift)}

    before = collations()
    # the models ask for byte order, so a database at 0023 is drift on every string column
    assert before["collations"] == {"default"} and before["drift"] > 100
    db.upgrade(url, "0025")
    after = collations()
    # the day partition made before the migration is byte-ordered too (an ALTER of the parent reaches it)
    assert any(t.startswith("gpu_sample_p") for t in after["tables"])
    # at 0025 only what later revisions add is missing (0029's vgpu_license_status and 0030's
    # nvlink_throughput_raw, each a column in gpu_sample and four in each of its two tiers; 0031's device_union
    # table and its index)
    assert after["collations"] == {"C"} and after["drift"] == 20
    db.upgrade(url)  # and on to integer GPU ids, the UUIDs byte-ordered in gpu_key
    assert collations()["drift"] == 0
    store = Store.open(url)
    got = store.read("gpu_sample").sort("power_w")
    assert got["gpu_uuid"].to_list() == gpus and got["power_w"].to_list() == [1.0, 2.0, 3.0, 4.0]
    assert store.read("metric_sample")["value"].to_list() == [1.5]
    # a key stored before the migration is still found by its index: the re-sent row writes nothing
    again = store.write(F.Batch(source="t2", gpu_sample=pl.DataFrame({"ts": [t0], "gpu_uuid": ["GPU-b"], "power_w": [2.0]})))
    assert again.written.get("gpu_sample", 0) == 0
    store.engine.dispose()
    db.downgrade(url, "0023")
    assert collations()["collations"] == {"default"}
    db.upgrade(url)  # the session's database is shared with later tests


def test_drift_is_detected(tmp_path):
    url = f"sqlite:///{tmp_path / 'd.db'}"
    db.upgrade(url)
    engine = db.make_engine(url)
    with engine.begin() as conn:
        conn.exec_driver_sql("ALTER TABLE gpu ADD COLUMN rogue TEXT")
    assert any("rogue" in repr(d) for d in db.schema_drift(engine))


def test_embedded_default_upgrades_itself(tmp_path, monkeypatch):
    monkeypatch.setenv("FLEETSCOPE_DATA_DIR", str(tmp_path))
    monkeypatch.delenv("FLEETSCOPE_DATABASE_URL", raising=False)
    settings = load()
    assert settings.auto_migrate and settings.is_sqlite
    engine = db.make_engine(settings.database_url)
    db.ensure_schema(settings, engine)
    assert db.current_revision(engine) == db.head_revision(settings.database_url)
    assert (tmp_path / "fleetscope.store.db").exists()
    assert engine.connect().exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"


def test_without_auto_migrate_a_stale_database_is_refused_with_the_fix(tmp_path, monkeypatch):
    monkeypatch.setenv("FLEETSCOPE_DATA_DIR", str(tmp_path))
    monkeypatch.setenv("FLEETSCOPE_AUTO_MIGRATE", "false")
    settings = load()
    engine = db.make_engine(settings.database_url)
    with pytest.raises(RuntimeError, match="fleetscope db upgrade"):
        db.ensure_schema(settings, engine)
    assert db.table_names(engine) == []


def test_0026_keys_raw_samples_by_integer_gpu_id_and_keeps_the_rows(pg_url):
    url = pg_url
    db.upgrade(url)  # from wherever the session's database was left (fresh, when this test runs first in its worker)
    db.downgrade(url, "0025")
    t0 = dt.datetime(2026, 6, 1, tzinfo=dt.UTC)
    gpus = ["GPU-b", "GPU-a", "GPU-b", "GPU-c"]
    engine = create_engine(url)
    partitions.forget_all(engine)
    partitions.ensure_days(engine, "gpu_sample", {t0.date()})
    with engine.begin() as conn:
        conn.execute(text("DELETE FROM gpu_sample"))
        conn.execute(text("INSERT INTO gpu_sample (ts, gpu_uuid, power_w) SELECT :t + make_interval(secs => i), u, p"
                          " FROM unnest(CAST(:g AS text[]), CAST(:p AS float8[])) WITH ORDINALITY AS x(u, p, i)"),
                     {"t": t0, "g": gpus, "p": [1.0, 2.0, 3.0, 4.0]})
    engine.dispose()
    db.upgrade(url)
    engine = create_engine(url)
    with engine.connect() as conn:
        keys = conn.execute(text("SELECT gpu_uuid, gpu_id FROM gpu_key ORDER BY gpu_id")).all()
        columns = {c["name"]: str(c["type"]) for c in inspect(conn).get_columns("gpu_sample")}
        pk = inspect(conn).get_pk_constraint("gpu_sample")["constrained_columns"]
    engine.dispose()
    # one id per UUID, in byte order; the samples keyed by it, the text column gone
    assert keys == [("GPU-a", 1), ("GPU-b", 2), ("GPU-c", 3)]
    assert columns["gpu_id"] == "INTEGER" and "gpu_uuid" not in columns and pk == ["gpu_id", "ts"]
    store = Store.open(url)
    got = store.read("gpu_sample", start=t0, end=t0 + dt.timedelta(minutes=1)).sort("power_w")
    assert got.select("gpu_uuid", "power_w").rows() == list(zip(gpus, [1.0, 2.0, 3.0, 4.0]))
    # the migrated key still holds: a re-sent sample writes nothing, a new GPU's gets the next id
    t1 = t0 + dt.timedelta(seconds=1)
    again = store.write(F.Batch(source="t", gpu_sample=pl.DataFrame({"ts": [t1, t1], "gpu_uuid": ["GPU-b", "GPU-d"], "power_w": [9.0, 5.0]})))
    assert again.written["gpu_sample"] == 1
    store.engine.dispose()
    db.downgrade(url, "0025")
    store_engine = create_engine(url)
    with store_engine.connect() as conn:
        rows = conn.execute(text("SELECT gpu_uuid, power_w FROM gpu_sample ORDER BY power_w")).all()
        assert conn.execute(text("SELECT to_regclass('gpu_key')")).scalar() is None
        conn.execute(text("DELETE FROM gpu_sample"))
        conn.commit()
    store_engine.dispose()
    assert rows == [("GPU-b", 1.0), ("GPU-a", 2.0), ("GPU-b", 3.0), ("GPU-c", 4.0), ("GPU-d", 5.0)]
    db.upgrade(url)  # the session's database is shared with later tests
