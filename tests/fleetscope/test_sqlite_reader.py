"""Large SQLite reads split across reader processes give exactly what one process reads, and fall back to
one process when the readers are gone."""

import datetime as dt
import sqlite3

import polars as pl
import pytest

from fleetscope.store import db
from fleetscope.store import sqlite_reader
from fleetscope.core import frames as F
from fleetscope.store import Store

T0 = dt.datetime(2026, 3, 1, tzinfo=dt.UTC)


@pytest.fixture
def sqlite_store(tmp_path, monkeypatch):
    url = f"sqlite:///{tmp_path / 'r.db'}"
    db.upgrade(url)
    st = Store.open(url)
    # 12 GPUs (8 in the job, the last 2 of them only for the second half hour) × 360 samples every 10 s
    uuids = [f"GPU-{i:02d}" for i in range(12)]
    n = 360
    rows = {
        "ts": [T0 + dt.timedelta(seconds=10 * s) for s in range(n) for _ in uuids],
        "gpu_uuid": [u for _ in range(n) for u in uuids],
        "power_w": [float(s * 100 + i) for s in range(n) for i in range(len(uuids))],
        # a column that is mostly null, as unsupported DCGM fields are
        "xid_last": [79 if (s == 7 and i == 3) else None for s in range(n) for i in range(len(uuids))],
    }
    half = T0 + dt.timedelta(minutes=30)
    st.write(F.Batch(
        source="t", gpu_sample=pl.DataFrame(rows),
        job_rank=pl.DataFrame({"job_id": ["j"] * 8, "rank": list(range(8)), "start": [T0] * 6 + [half] * 2,
                               "gpu_uuid": uuids[:8], "host": ["h"] * 8}),
    ))
    monkeypatch.setattr(sqlite_reader, "WORKERS", 3)
    yield st
    st.engine.dispose()


def _serial(store: Store, monkeypatch, **kw) -> pl.DataFrame:
    with monkeypatch.context() as m:
        m.setattr(sqlite_reader, "WORKERS", 1)
        return store.read("gpu_sample", **kw)


@pytest.mark.parametrize("kw", [
    {"job_id": "j", "start": T0, "end": T0 + dt.timedelta(hours=1)},
    # odd bounds: slice edges fall between samples and on them; nothing is read twice or lost
    {"job_id": "j", "start": T0 + dt.timedelta(seconds=5), "end": T0 + dt.timedelta(seconds=3595)},
    {"start": T0, "end": T0 + dt.timedelta(seconds=3590), "gpu_uuid": ["GPU-03", "GPU-11"]},
    {"start": T0 + dt.timedelta(minutes=29), "end": T0 + dt.timedelta(minutes=31)},
])
def test_parallel_read_equals_the_one_process_read(sqlite_store, monkeypatch, kw):
    monkeypatch.setattr(sqlite_reader, "MIN_ROWS", 10)
    # without this spy a read that quietly stayed in-process would compare the serial read with itself
    calls = []
    real = sqlite_reader.fetch_parts

    def spy(path, parts, dtypes):
        df = real(path, parts, dtypes)
        calls.append((len(parts), df))
        return df

    monkeypatch.setattr(sqlite_reader, "fetch_parts", spy)
    parallel = sqlite_store.read("gpu_sample", **kw)
    assert [n for n, _ in calls] == [3]
    assert calls[0][1] is not None and calls[0][1].height == parallel.height
    serial = _serial(sqlite_store, monkeypatch, **kw)
    assert parallel.height > 0
    assert parallel.schema == serial.schema and parallel.equals(serial)


def test_the_job_read_has_its_ranks_while_they_held_their_gpus(sqlite_store, monkeypatch):
    monkeypatch.setattr(sqlite_reader, "MIN_ROWS", 10)
    df = sqlite_store.read("gpu_sample", job_id="j", start=T0, end=T0 + dt.timedelta(hours=1))
    # 6 ranks for the whole hour, 2 for its second half
    assert df.height == 6 * 360 + 2 * 180
    assert df.filter(pl.col("rank") == 7)["ts"].min() == T0 + dt.timedelta(minutes=30)
    assert df["xid_last"].drop_nulls().to_list() == [79]
    assert df.schema["ts"] == F.UTC_US and df["job_id"].unique().to_list() == ["j"]


def test_small_reads_stay_in_process(sqlite_store, monkeypatch):
    monkeypatch.setattr(sqlite_reader, "fetch_parts", lambda *a, **k: pytest.fail("a small read went to the reader processes"))
    assert sqlite_store.read("gpu_sample", start=T0, end=T0 + dt.timedelta(minutes=1)).height == 12 * 6


def test_dead_readers_fall_back_to_one_process(sqlite_store, monkeypatch, caplog):
    monkeypatch.setattr(sqlite_reader, "MIN_ROWS", 10)
    kw = {"job_id": "j", "start": T0, "end": T0 + dt.timedelta(hours=1)}
    want = _serial(sqlite_store, monkeypatch, **kw)
    # Killing the processes beforehand is not enough: _pool() drops dead readers and starts new ones, so
    # the readers must fail in the middle of the request, as a reader that dies mid-read does.
    with monkeypatch.context() as m:
        def broken(self, *a, **k):
            raise BrokenPipeError(f"SQLite reader process {self.proc.pid} exited (status -9)")

        m.setattr(sqlite_reader._Reader, "fetch", broken)
        with caplog.at_level("WARNING", logger=sqlite_reader.__name__):
            got = sqlite_store.read("gpu_sample", **kw)
    assert got.equals(want)
    assert sqlite_reader._readers == []
    assert any(r.name == sqlite_reader.__name__ and "parallel SQLite read unavailable" in r.getMessage()
               and "reading in one process" in r.getMessage() for r in caplog.records)
    # and the next read starts new readers
    assert sqlite_store.read("gpu_sample", **kw).equals(want)
    assert len(sqlite_reader._readers) == 3 and all(r.proc.poll() is None for r in sqlite_reader._readers)


def test_a_bad_statement_in_a_reader_raises_its_own_error(tmp_path, monkeypatch):
    monkeypatch.setattr(sqlite_reader, "WORKERS", 2)
    path = str(tmp_path / "x.db")
    sqlite3.connect(path).close()
    with pytest.raises(sqlite3.OperationalError, match="no such table"):
        sqlite_reader.fetch_parts(path, [("SELECT * FROM nowhere", [])] * 2, {})


def test_readers_write_nothing(tmp_path):
    path = str(tmp_path / "x.db")
    con = sqlite3.connect(path)
    con.execute("CREATE TABLE t (x)")
    con.commit()
    con.close()
    with pytest.raises(sqlite3.OperationalError, match="readonly|read-only|query_only"):
        sqlite_reader.fetch(path, "INSERT INTO t VALUES (1)", [], {})
