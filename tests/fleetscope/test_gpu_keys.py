"""PostgreSQL's raw samples keyed by integer GPU id (store/gpu_keys.py): every write path maps UUIDs to ids and
every read maps them back; an id is made once however many writers meet a GPU at once; and an id made by a
transaction that rolled back is never remembered (a remembered id with no gpu_key row would hide its samples
from every read)."""

from __future__ import annotations

import datetime as dt
import threading

import polars as pl
import pytest
from sqlalchemy import text

from fleetscope.core import frames as F
from fleetscope.store import Store
from fleetscope.store.writing import Rows

T0 = dt.datetime(2026, 11, 3, 12, 0, tzinfo=dt.UTC)


@pytest.fixture
def pg(store: Store) -> Store:
    if store.dialect != "postgresql":
        pytest.skip("SQLite keeps the text key")
    return store


def _keys(store: Store) -> list[tuple[str, int]]:
    with store.engine.connect() as conn:
        return [tuple(r) for r in conn.execute(text("SELECT gpu_uuid, gpu_id FROM gpu_key ORDER BY gpu_uuid"))]


def _frame(gpus: list[str], n: int, t0: dt.datetime = T0, power: float = 100.0) -> pl.DataFrame:
    return pl.DataFrame({"ts": [t0 + dt.timedelta(seconds=10 * i) for g in gpus for i in range(n)],
                         "gpu_uuid": [g for g in gpus for _ in range(n)],
                         "power_w": [power + i for _ in gpus for i in range(n)]})


def _log(r):  # type: ignore[no-untyped-def]
    return [("test", None, r.written, 0)]


def test_every_write_path_stores_ids_and_reads_uuids(pg: Store) -> None:
    # a COPYed frame (1,000 rows or more), a small frame, and a push's rows pipelined
    assert pg.write(F.Batch(source="big", gpu_sample=_frame(["GPU-b", "GPU-a"], 600))).written["gpu_sample"] == 1200
    assert pg.write(F.Batch(source="small", gpu_sample=_frame(["GPU-a", "GPU-c"], 3, T0 + dt.timedelta(hours=3)))).written["gpu_sample"] == 6
    t_us = int((T0 + dt.timedelta(hours=4)).timestamp() * 1e6)
    rows = Rows(("ts", "gpu_uuid", "power_w"), [(t_us, "GPU-d", 7.0), (t_us, "GPU-c", 8.0)])
    assert pg.write_rows([(F.FRAMES["gpu_sample"], rows)], ingest_log=_log).written["gpu_sample"] == 2
    keys = dict(_keys(pg))
    assert sorted(keys) == ["GPU-a", "GPU-b", "GPU-c", "GPU-d"] and len(set(keys.values())) == 4
    got = pg.read("gpu_sample", columns=["ts", "gpu_uuid", "power_w"])
    assert got.group_by("gpu_uuid").len().sort("gpu_uuid").rows() == [("GPU-a", 603), ("GPU-b", 600), ("GPU-c", 4), ("GPU-d", 1)]
    assert got.filter(pl.col("ts") == T0 + dt.timedelta(hours=4)).sort("gpu_uuid").select("gpu_uuid", "power_w").rows() == [("GPU-c", 8.0),
                                                                                                                           ("GPU-d", 7.0)]
    with pg.engine.connect() as conn:
        stored = conn.execute(text("SELECT k.gpu_uuid, count(*) FROM gpu_sample s JOIN gpu_key k USING (gpu_id) GROUP BY 1 ORDER BY 1")).all()
    assert [tuple(r) for r in stored] == [("GPU-a", 603), ("GPU-b", 600), ("GPU-c", 4), ("GPU-d", 1)]

    # re-sent, each path finds its rows by the integer key: nothing new, a missing field filled
    assert pg.write(F.Batch(source="big2", gpu_sample=_frame(["GPU-b", "GPU-a"], 600))).written.get("gpu_sample", 0) == 0
    # the next scrape lists the same GPUs in the same order: the ids of the last one are taken whole
    later = T0 + dt.timedelta(hours=5)
    scrape = _frame(["GPU-b", "GPU-a"], 600, later).with_columns(power_w=pl.when(pl.col("gpu_uuid") == "GPU-b").then(2.0).otherwise(1.0))
    assert pg.write(F.Batch(source="big3", gpu_sample=scrape)).written["gpu_sample"] == 1200
    back = pg.read("gpu_sample", start=later, columns=["gpu_uuid", "power_w"]).group_by("gpu_uuid").agg(pl.col("power_w").unique())
    assert sorted(back.rows()) == [("GPU-a", [1.0]), ("GPU-b", [2.0])]
    again = Rows(("ts", "gpu_uuid", "power_w", "temp_c"), [(t_us, "GPU-d", 99.0, 41.0)])
    assert pg.write_rows([(F.FRAMES["gpu_sample"], again)], ingest_log=_log).written["gpu_sample"] == 1
    d = pg.read("gpu_sample", gpu_uuid="GPU-d", columns=["gpu_uuid", "power_w", "temp_c"])
    assert d.rows() == [("GPU-d", 7.0, 41.0)]  # the first copy's value kept, the field it lacked filled


def test_an_id_made_by_a_rolled_back_write_is_not_remembered(pg: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    real = pg._log_ingest

    def fail(conn, entries):  # type: ignore[no-untyped-def]
        raise RuntimeError("the disk filled up")

    monkeypatch.setattr(pg, "_log_ingest", fail)
    with pytest.raises(RuntimeError, match="disk filled"):
        pg.write(F.Batch(source="lost", gpu_sample=_frame(["GPU-new"], 1000)))  # mapped to a new id, then rolled back
    assert _keys(pg) == []
    monkeypatch.setattr(pg, "_log_ingest", real)
    # the same GPU again, by COPY: it must get an id that exists, not the rolled-back one
    assert pg.write(F.Batch(source="kept", gpu_sample=_frame(["GPU-new"], 1000))).written["gpu_sample"] == 1000
    assert [u for u, _ in _keys(pg)] == ["GPU-new"]
    assert pg.read("gpu_sample", gpu_uuid="GPU-new", columns=["ts"]).height == 1000


def test_many_writers_meeting_new_gpus_make_one_id_each(pg: Store, db_url: str) -> None:
    stores = [Store.open(db_url) for _ in range(4)]
    gpus = [f"GPU-{i:03d}" for i in range(40)]
    errors: list[BaseException] = []

    def push(k: int, s: Store) -> None:
        try:
            for j in range(5):
                t_us = int((T0 + dt.timedelta(seconds=10 * (5 * k + j))).timestamp() * 1e6)
                # each writer names the GPUs in its own order: the ids are still made in key order, so no deadlock
                order = gpus if k % 2 else gpus[::-1]
                s.write_rows([(F.FRAMES["gpu_sample"], Rows(("ts", "gpu_uuid", "power_w"), [(t_us, g, float(k)) for g in order]))], ingest_log=_log)
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=push, args=(k, s)) for k, s in enumerate(stores)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    for s in stores:
        s.engine.dispose()
    assert errors == []
    keys = _keys(pg)
    assert [u for u, _ in keys] == gpus and len({i for _, i in keys}) == 40
    assert pg.read("gpu_sample", columns=["gpu_uuid"]).group_by("gpu_uuid").len()["len"].to_list() == [20] * 40
