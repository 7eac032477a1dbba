"""The store on SQLite and on PostgreSQL: atomic, idempotent writes and typed reads."""

import datetime as dt

import numpy as np
import polars as pl
import pytest
from polars.testing import assert_frame_equal

from fleetscope.core import frames as F
from fleetscope.core.errors import ValidationError
from fleetscope.store import Store, ingest_log

T0 = dt.datetime(2026, 3, 1, 12, tzinfo=dt.UTC)
S = dt.timedelta(seconds=1)


def inventory() -> F.Batch:
    return F.Batch(
        source="test",
        site=pl.DataFrame({"site_id": ["eu-1"], "country": ["FRA"], "declared_pue": [1.2]}),
        host=pl.DataFrame({"host": ["n1", "n2"], "site_id": ["eu-1", "eu-1"], "rack": ["r1", None]}),
        gpu=pl.DataFrame({"gpu_uuid": ["g0", "g1", "g2"], "host": ["n1", "n1", "n2"], "gpu_index": [0, 1, 0]}),
        job_rank=pl.DataFrame(
            {
                "job_id": ["j1", "j1", "j2"],
                "rank": [0, 1, 0],
                "start": [T0, T0, T0 + 2 * S],
                # j1 rank 1 moved off g1 after 2 s; j2 took g1 from then on.
                "end": [None, T0 + 2 * S, None],
                "gpu_uuid": ["g0", "g1", "g1"],
            }
        ),
    )


def samples(n_seconds: int = 4) -> pl.DataFrame:
    rows = []
    for s in range(n_seconds):
        for i, g in enumerate(["g0", "g1", "g2"]):
            rows.append({"ts": T0 + s * S, "gpu_uuid": g, "power_w": 100.0 * (i + 1) + s, "energy_j": 1e6 + s * 100.0,
                         "fb_used_bytes": (i + 1) * 2**30, "xid_last": 0 if s < 3 else 79})
    return pl.DataFrame(rows)


def test_round_trip_keeps_values_and_dtypes(store: Store):
    store.write(inventory())
    store.write(F.Batch(source="t", gpu_sample=samples()))
    got = store.read("gpu_sample", columns=["ts", "gpu_uuid", "power_w", "energy_j", "fb_used_bytes", "xid_last"])
    want = F.conform(F.GPU_SAMPLE, samples()).select(got.columns).sort("ts", "gpu_uuid")
    assert_frame_equal(got, want)
    assert got.schema["ts"] == F.UTC_US
    assert got.schema["fb_used_bytes"] == pl.Int64


def test_fields_a_source_never_sends_read_back_null(store: Store):
    # All-null columns are left out of the INSERT or COPY (fleetscope.store.sql.bound_columns): they must still
    # read back as NULL, and a later batch that has them must fill them in.
    store.write(inventory())
    store.write(F.Batch(source="t", gpu_sample=samples(2)))
    got = store.read("gpu_sample", columns=["gpu_uuid", "power_w", "temp_c", "sm_clock_mhz"])
    assert got.height == 6 and got["temp_c"].null_count() == 6 and got["power_w"].null_count() == 0
    later = samples(3).filter(pl.col("ts") == T0 + 2 * S).with_columns(temp_c=pl.lit(61.5))
    store.write(F.Batch(source="t", gpu_sample=later))
    got = store.read("gpu_sample", columns=["ts", "temp_c"]).sort("ts")
    assert got["temp_c"].to_list() == [None] * 6 + [61.5] * 3


def test_metric_samples_keep_their_series_when_a_scrape_repeats_its_series_column(store: Store):
    # The 2nd write finds every series of the 1st stored and remembers the column; the 3rd reuses its ids;
    # the 4th lists the series in another order and a new one, and is looked up again.
    value_of = {'DCGM_FI_A{gpu_uuid="GPU-1"}': 1.0, 'DCGM_FI_A{gpu_uuid="GPU-2"}': 2.0, 'DCGM_FI_B{gpu_uuid="GPU-1"}': 3.0,
                'DCGM_FI_C{gpu_uuid="GPU-1"}': 4.0}
    keys = list(value_of)

    def frame(k: int, order: list[str]) -> pl.DataFrame:
        return pl.DataFrame({"ts": [T0 + k * S] * len(order), "series": order, "value": [value_of[x] + 10 * k for x in order]})

    for k in range(3):
        assert store.write(F.Batch(source="t", metric_sample=frame(k, keys[:3]))).written["metric_sample"] == 3
    assert store.write(F.Batch(source="t", metric_sample=frame(3, [keys[3], keys[2], keys[0], keys[1]]))).written["metric_sample"] == 4
    got = store.read("metric_sample").sort("series", "ts")
    want = pl.concat([frame(k, keys[:3]) for k in range(3)] + [frame(3, keys)]).sort("series", "ts")
    assert_frame_equal(got.select("ts", "series", "value"), F.conform(F.METRIC_SAMPLE, want).select("ts", "series", "value"))


def test_writing_twice_keeps_one_copy(store: Store):
    batch = inventory().merge(F.Batch(gpu_sample=samples()))
    first = store.write(batch)
    second = store.write(batch)
    assert first.written["gpu_sample"] == 12 and first.written["gpu"] == 3
    # The inventory rows are upserts: identical ones are not rewritten, so nothing counts as written.
    assert second.written == {"site": 0, "host": 0, "gpu": 0, "job_rank": 0, "gpu_sample": 0}
    counts = store.counts()
    assert counts["gpu_sample"] == 12 and counts["gpu"] == 3 and counts["job_rank"] == 3


def test_update_frames_merge_without_erasing_known_values(store: Store):
    store.write(inventory())
    res = store.write(F.Batch(gpu=pl.DataFrame({"gpu_uuid": ["g0", "g1"], "model_name": ["NVIDIA H200", None], "host": [None, "n1"]})))
    assert res.written["gpu"] == 1  # g1 brought nothing new: its host is already n1 and a null erases nothing
    gpu = store.read("gpu").filter(pl.col("gpu_uuid") == "g0")
    assert gpu["model_name"][0] == "NVIDIA H200"
    assert gpu["host"][0] == "n1"  # the second source did not know the host; it stays
    assert store.write(F.Batch(gpu=pl.DataFrame({"gpu_uuid": ["g1"], "host": ["n2"]}))).written["gpu"] == 1
    assert store.read("gpu").filter(pl.col("gpu_uuid") == "g1")["host"][0] == "n2"


def test_bad_row_rejects_the_whole_batch_and_changes_nothing(store: Store):
    store.write(inventory())
    before = store.counts()
    bad = F.Batch(
        source="bad",
        gpu_sample=samples(),
        health_event=pl.DataFrame({"ts": [T0, T0], "gpu_uuid": ["g0", "g1"], "kind": ["xid", None], "code": [79, 48]}),
    )
    with pytest.raises(ValidationError) as err:
        store.write(bad)
    assert (err.value.frame, err.value.row, err.value.field) == ("health_event", 1, "kind")
    assert store.counts() == before


def test_failure_inside_the_transaction_rolls_back_every_frame(store: Store, monkeypatch: pytest.MonkeyPatch):
    real = Store._write_frame

    def fail_on_health(self, conn, spec, df, new_series):
        if spec.name == "health_event":
            raise RuntimeError("disk full")
        return real(self, conn, spec, df, new_series)

    monkeypatch.setattr(Store, "_write_frame", fail_on_health)
    batch = inventory().merge(F.Batch(gpu_sample=samples(), health_event=pl.DataFrame({"ts": [T0], "gpu_uuid": ["g0"], "kind": ["xid"], "code": [79]})))
    with pytest.raises(RuntimeError, match="disk full"):
        store.write(batch)
    monkeypatch.undo()
    assert all(n == 0 for n in store.counts().values())


def test_time_window_and_gpu_filters(store: Store):
    store.write(F.Batch(gpu_sample=samples()))
    got = store.read("gpu_sample", start=T0 + S, end=T0 + 3 * S, gpu_uuid=["g0", "g2"], columns=["ts", "gpu_uuid", "power_w"])
    assert got.height == 4
    assert got["ts"].min() == T0 + S and got["ts"].max() == T0 + 2 * S
    assert set(got["gpu_uuid"]) == {"g0", "g2"}


def test_gpu_samples_of_a_job_follow_its_rank_assignments(store: Store):
    store.write(inventory().merge(F.Batch(gpu_sample=samples())))
    j1 = store.read("gpu_sample", job_id="j1", columns=["ts", "gpu_uuid", "power_w"])
    # rank 0 on g0 for all 4 s, rank 1 on g1 for the first 2 s only
    assert j1.height == 6
    assert j1.filter(pl.col("rank") == 1)["ts"].to_list() == [T0, T0 + S]
    j2 = store.read("gpu_sample", job_id="j2", columns=["ts", "gpu_uuid"])
    assert j2["ts"].to_list() == [T0 + 2 * S, T0 + 3 * S]
    assert set(j2["gpu_uuid"]) == {"g1"}
    # PostgreSQL joins the ranks in polars (no plan to go wrong on a fresh partition's missing statistics); a read
    # with a limit joins them in SQL: both give the same rows, columns, types and order, as SQLite's join does
    both = store.read("gpu_sample", job_id=["j1", "j2"])
    assert both.columns == ["job_id", "rank", *F.GPU_SAMPLE.names] and both.height == 8
    assert both.equals(store.read("gpu_sample", job_id=["j1", "j2"], limit=100))
    assert both.select("ts", "gpu_uuid").equals(both.select("ts", "gpu_uuid").sort("ts", "gpu_uuid"))


def test_metric_series_round_trip_with_hostile_labels(store: Store):
    key_a = F.series_key("facility_power_w", {"site": "eu-1", "meter": 'main "A", north\nwing'})
    key_b = F.series_key("facility_power_w", {"site": "eu-2"})
    df = pl.DataFrame({"ts": [T0, T0, T0 + S], "series": [key_a, key_b, key_a], "value": [1.5e6, 2.5e6, 1.6e6]})
    store.write(F.Batch(metric_sample=df))
    store.write(F.Batch(metric_sample=df))
    got = store.read("metric_sample")
    assert got.height == 3
    assert got.filter(pl.col("series") == key_a)["value"].to_list() == [1.5e6, 1.6e6]


def test_text_survives_quotes_commas_newlines_unicode_and_empty_strings(store: Store):
    msgs = ['a "quoted", comma', "line1\nline2\r\n", "ünïcødé ✓ 日本", "", "back\\slash", "tab\there", "'; DROP TABLE gpu; --"]
    df = pl.DataFrame({"ts": [T0 + i * S for i in range(len(msgs))], "kind": ["nccl_warn"] * len(msgs), "message": msgs, "host": ["h"] * len(msgs)})
    store.write(F.Batch(health_event=df))
    got = store.read("health_event")
    assert got["message"].to_list() == msgs
    assert got["gpu_uuid"].to_list() == [""] * len(msgs)  # empty string, not NULL
    assert store.counts()["gpu"] == 0


def test_filter_values_are_literals_not_sql(store: Store):
    store.write(inventory().merge(F.Batch(gpu_sample=samples())))
    assert store.read("gpu_sample", gpu_uuid="g0' OR '1'='1").height == 0
    assert store.read("gpu_sample", job_id=["j1'; DELETE FROM gpu_sample; --"]).height == 0
    assert store.counts()["gpu_sample"] == 12


def test_empty_reads_have_canonical_schema(store: Store):
    got = store.read("finding")
    assert got.height == 0
    assert got.schema == pl.Schema(F.FINDING.schema)


def test_small_reads_give_what_bulk_reads_give(store: Store):
    # PostgreSQL sends a small read over a pooled connection (store.pg_read), a bulk one through connectorx:
    # the same frame, dtypes, nulls, text and timestamps included
    msgs = ['a "quoted", comma', "50% 'off'", "ünïcødé ✓", "", None, "line1\nline2\r\n", "tab\there", "back\\slash", "\\.", " padded "]
    health = pl.DataFrame({"ts": [T0 + i * S for i in range(len(msgs))], "kind": ["nccl_warn"] * len(msgs), "message": msgs, "host": ["h"] * len(msgs)})
    nt = pl.DataFrame({"run_id": ["r", "r"], "op": ["all_reduce"] * 2, "size_bytes": [8, 8], "in_place": [False, True],
                       "busbw_gbps": [None, 1.5]})
    store.write(inventory().merge(F.Batch(gpu_sample=samples(), health_event=health, nccl_test=nt)))
    for frame, kw, rows in [("job_rank", {"job_id": "j1"}, 2), ("host", {}, 2), ("gpu", {"gpu_uuid": ["g0", "g2"]}, 2), ("health_event", {}, 10),
                            ("nccl_test", {}, 2), ("gpu_sample", {"start": T0 + S, "columns": ["ts", "gpu_uuid", "power_w", "xid_last"]}, 9),
                            ("finding", {}, 0), ("job_rank", {"job_id": "none"}, 0)]:
        bulk, small = store.read(frame, **kw), store.read(frame, small=True, **kw)
        assert_frame_equal(small, bulk, check_exact=True)
        assert small.height == rows
    assert store.read("health_event", small=True)["message"].to_list() == msgs
    assert store.read("gpu_sample", small=True, limit=2).height == 2
    # doubles come back bit for bit: the shortest text that reads back to the same value, at every magnitude
    rng = np.random.default_rng(3)
    powers = (rng.standard_normal(500) * 10.0 ** rng.integers(-300, 300, 500)).tolist() + [5e-324, 1.7976931348623157e308, 0.1, 1 / 3]
    times = [T0 + dt.timedelta(microseconds=int(u)) for u in rng.integers(0, 10**12, len(powers))]
    store.write(F.Batch(gpu_sample=pl.DataFrame({"ts": times, "gpu_uuid": "g9", "power_w": powers})))
    got = store.read("gpu_sample", gpu_uuid="g9", columns=["ts", "power_w"], small=True)
    assert_frame_equal(got, store.read("gpu_sample", gpu_uuid="g9", columns=["ts", "power_w"]), check_exact=True)
    assert sorted(got["power_w"].to_list()) == sorted(powers) and got.height == len(powers)


def test_a_small_read_that_is_not_small_is_read_whole(store: Store, monkeypatch: pytest.MonkeyPatch):
    from fleetscope.store import pg_read

    monkeypatch.setattr(pg_read, "SMALL_ROWS", 5)
    store.write(inventory().merge(F.Batch(gpu_sample=samples())))
    assert_frame_equal(store.read("gpu_sample", small=True), store.read("gpu_sample"))
    assert store.read("gpu_sample", small=True).height == 12 and store.read("gpu_sample", small=True, limit=4).height == 4


def test_nccl_test_booleans_and_findings_upsert(store: Store):
    nt = pl.DataFrame({"run_id": ["r", "r"], "op": ["all_reduce"] * 2, "size_bytes": [8, 8], "in_place": [False, True], "busbw_gbps": [1.25, 1.5]})
    store.write(F.Batch(nccl_test=nt))
    got = store.read("nccl_test").sort("in_place")
    assert got["in_place"].to_list() == [False, True]
    assert got["busbw_gbps"].to_list() == [1.25, 1.5]
    finding = {"analyzer": "straggler", "kind": "straggler", "subject": "job:j1/rank:3", "window_start": T0, "severity": "warning", "score": 2.0}
    store.write(F.Batch(finding=pl.DataFrame([finding])))
    store.write(F.Batch(finding=pl.DataFrame([{**finding, "severity": "critical", "score": 5.0}])))
    f = store.read("finding")
    assert f.height == 1 and f["severity"][0] == "critical" and f["score"][0] == 5.0


def test_large_batch_round_trip(store: Store):
    n = 20_000
    df = pl.DataFrame({"ts": [T0 + dt.timedelta(milliseconds=i) for i in range(n)], "gpu_uuid": [f"g{i % 7}" for i in range(n)], "power_w": [float(i) for i in range(n)]})
    res = store.write(F.Batch(gpu_sample=df))
    assert res.written["gpu_sample"] == n and res.values == n
    assert store.read("gpu_sample", columns=["power_w"])["power_w"].sum() == sum(range(n))


def test_large_overlapping_batch_writes_only_its_new_rows(store: Store):
    # Large enough for PostgreSQL's direct COPY, whose failure on the stored half must undo only itself.
    def batch(first: int, n: int) -> F.Batch:
        rows = range(first, first + n)
        return F.Batch(gpu_sample=pl.DataFrame({"ts": [T0 + i * S for i in rows], "gpu_uuid": ["g0"] * n, "power_w": [float(i) for i in rows]}),
                       metric_sample=pl.DataFrame({"ts": [T0 + i * S for i in rows], "series": ['up{job="x"}'] * n, "value": [float(i) for i in rows]}))

    assert store.write(batch(0, 3000)).written == {"gpu_sample": 3000, "metric_sample": 3000}
    assert store.write(batch(1500, 3000)).written == {"gpu_sample": 1500, "metric_sample": 1500}
    assert store.write(batch(1500, 3000)).written == {"gpu_sample": 0, "metric_sample": 0}
    got = store.read("gpu_sample")
    assert got.height == 4500 and got["power_w"].sum() == sum(range(4500))
    assert store.read("metric_sample")["value"].sum() == sum(range(4500))
    assert store.counts()["metric_sample"] == 4500


def test_unknown_frame_and_column_are_refused(store: Store):
    with pytest.raises(ValueError, match="unknown frame"):
        store.read("gpus")
    with pytest.raises(ValueError, match="no column"):
        store.read("gpu_sample", columns=["watts"])
    with pytest.raises(ValueError, match="cannot be filtered by job_id"):
        store.read("health_event", job_id="j1")


def test_series_ids_from_a_rolled_back_write_are_not_remembered(store: Store, monkeypatch: pytest.MonkeyPatch):
    real = Store._write_frame
    ms = pl.DataFrame({"ts": [T0], "series": ['pdu_power_w{rack="r1"}'], "value": [5.0e3]})

    def fail_after_series(self, conn, spec, df, new_series):
        n = real(self, conn, spec, df, new_series)
        if spec.name == "metric_sample":
            raise RuntimeError("connection lost")
        return n

    monkeypatch.setattr(Store, "_write_frame", fail_after_series)
    with pytest.raises(RuntimeError):
        store.write(F.Batch(metric_sample=ms))
    monkeypatch.undo()
    assert store._series_cache == {}
    store.write(F.Batch(metric_sample=ms))
    assert store.read("metric_sample")["value"].to_list() == [5.0e3]
    # a second scrape of the same series reuses the remembered id
    store.write(F.Batch(metric_sample=ms.with_columns(pl.lit(T0 + S).alias("ts"))))
    assert store.read("metric_sample").height == 2 and len(store._series_cache) == 1


def test_series_stored_by_another_process_keep_their_ids(store: Store):
    def ms(names: list[str]) -> pl.DataFrame:
        return pl.DataFrame({"ts": [T0] * len(names), "series": [f'{n}{{gpu="0"}}' for n in names], "value": [1.0] * len(names)})

    store.write(F.Batch(metric_sample=ms(["a", "b"])))
    ids = dict(store.query("SELECT series, series_id FROM series").iter_rows())
    other = Store(store.engine)  # nothing remembered: "a" and "b" exist, "c" is new
    assert other.write(F.Batch(metric_sample=ms(["a", "b", "c"]).with_columns(pl.lit(T0 + S).alias("ts")))).written == {"metric_sample": 3}
    after = dict(store.query("SELECT series, series_id FROM series").iter_rows())
    assert {k: after[k] for k in ids} == ids and len(after) == 3 and other._series_cache == after
    got = store.read("metric_sample").group_by("series").len().sort("series")
    assert got.rows() == [('a{gpu="0"}', 2), ('b{gpu="0"}', 2), ('c{gpu="0"}', 1)]


def test_the_duplicate_check_probes_the_index_even_on_a_young_log(pg_migrated: str):
    """A new store's ingest log is small and unanalysed when the check is first prepared; the plan
    PostgreSQL keeps for it must still probe the index once the log has grown, or each group's check
    grows with the log. The plain ``= ANY`` form falls into this (a sequential scan kept), the check's does not."""
    import psycopg

    from fleetscope.store import pg_write

    with psycopg.connect(pg_migrated.replace("+psycopg", ""), autocommit=True) as conn:
        # a fresh copy of the log (its columns, collations and indexes) first on the search path
        conn.execute("CREATE SCHEMA young")
        try:
            conn.execute("CREATE TABLE young.ingest_log (LIKE public.ingest_log INCLUDING ALL)")
            conn.execute("SET search_path = young, public")

            def grow(n: int) -> None:
                conn.execute("INSERT INTO ingest_log (at, source, content_sha256, rows_json, \"values\") SELECT now(), 's',"
                             " md5(g::text || %s) || md5(g::text), '{}', 1 FROM generate_series(1, %s::int) g", (str(n), n))

            def plan_once_grown(sql: str) -> str:
                conn.execute(f"PREPARE q(text[]) AS {sql}")
                try:
                    for _ in range(10):  # a group's check at a time, the log gaining a group's rows each
                        grow(16)
                        conn.execute("EXECUTE q(ARRAY['a', 'b'])")
                    grow(6000)
                    return "\n".join(r[0] for r in conn.execute("EXPLAIN EXECUTE q(ARRAY['a', 'b'])"))
                finally:
                    conn.execute("DEALLOCATE q")
                    conn.execute("TRUNCATE ingest_log")

            assert "Seq Scan on ingest_log" in plan_once_grown("SELECT content_sha256 FROM ingest_log WHERE content_sha256 = ANY($1)")
            probed = plan_once_grown(pg_write.LOGGED_SQL.format("$1"))
            assert "Index" in probed and "Seq Scan" not in probed
            grow(3)
            stored = [r[0] for r in conn.execute("SELECT content_sha256 FROM ingest_log ORDER BY 1")]
            check = pg_write.LOGGED_SQL.format("%s")
            assert sorted(r[0] for r in conn.execute(check, ([stored[0], "f" * 64, stored[2], stored[2]],))) == [stored[0], stored[2], stored[2]]
            assert conn.execute(check, (["f" * 64],)).fetchall() == []
        finally:
            conn.execute("DROP SCHEMA young CASCADE")


def test_concurrent_writers_of_one_process_all_land(store: Store):
    # The API ingests in a thread pool: on SQLite the writers queue on the store's lock, on PostgreSQL
    # they run side by side; either way every batch is written once.
    from concurrent.futures import ThreadPoolExecutor

    def batch(k: int) -> F.Batch:
        n = 2000
        order = range(n) if k % 2 else reversed(range(n))  # inventory rows in two orders, as two sources send them
        return F.Batch(gpu=pl.DataFrame({"gpu_uuid": [f"g{i}" for i in order], "host": [f"n{k}"] * n}),
                       gpu_sample=pl.DataFrame({"ts": [T0 + k * S] * n, "gpu_uuid": [f"g{i}" for i in range(n)], "power_w": [float(k)] * n}),
                       metric_sample=pl.DataFrame({"ts": [T0 + k * S] * n, "series": [f'm{{gpu="{i}"}}' for i in range(n)], "value": [float(k)] * n}))

    with ThreadPoolExecutor(4) as pool:
        results = list(pool.map(lambda k: store.write(batch(k)), range(8)))
    assert [r.written for r in results] == [{"gpu": 2000, "gpu_sample": 2000, "metric_sample": 2000}] * 8
    assert store.counts()["gpu_sample"] == 16_000 and store.counts()["metric_sample"] == 16_000
    assert store.read("gpu_sample").group_by("ts").agg(pl.col("power_w").first()).sort("ts")["power_w"].to_list() == [float(k) for k in range(8)]


def _write_as_rows(store: Store, batch: F.Batch):
    """``batch`` written as ``Store.write_rows`` takes a group of agents' pushes: conformed, as plain rows."""
    from fleetscope.store.writing import Rows

    frames = []
    for spec, df in batch.frames():
        df = F.conform(spec, df)
        df = df.with_columns([pl.col(c).dt.epoch("us") for c in df.columns if df.schema[c] == F.UTC_US])
        df = df.select([c for c in df.columns if df[c].null_count() < df.height])
        frames.append((spec, Rows(tuple(df.columns), df.rows())))
    return store.write_rows(frames, ingest_log=lambda r: [(batch.source or "rows", None, r.written, 0)])


# The two ways a write decides which fault-counter readings are new: over frames, and over a group's plain rows.
WRITES = {"frames": lambda store, batch: store.write(batch), "rows": _write_as_rows}


@pytest.mark.parametrize("via", list(WRITES))
def test_a_fault_counter_reading_that_repeats_is_not_a_new_health_event(store, via):
    """dcgm-exporter reports a GPU's ECC and row-remap counters in every scrape: an event is stored for a
    first reading, a rise and a reading after a reset, not for each scrape that repeats the last one; XIDs
    (the last-XID gauge the alert rules read) are kept as they come. So whichever way the write goes."""
    write = WRITES[via]
    t = [dt.datetime(2026, 5, 1, tzinfo=dt.UTC) + dt.timedelta(seconds=s) for s in range(6)]

    def ev(rows):
        return F.Batch(health_event=pl.DataFrame(rows, schema={"ts": F.UTC_US, "gpu_uuid": pl.String, "host": pl.String, "kind": pl.String,
                                                               "code": pl.Int64, "value": pl.Float64, "message": pl.String, "source": pl.String}))

    def row(i, gpu, kind, code, value):
        return {"ts": t[i], "gpu_uuid": gpu, "host": "h", "kind": kind, "code": code, "value": value, "message": f"{code}={value}", "source": "dcgm"}

    # one batch holding three scrapes: SBE aggregate 4, 4, 5 on GPU-1; row-remap pending 1, 1, 1 on GPU-2; XID 13 thrice
    first = [row(i, "GPU-1", "ecc", 312, v) for i, v in enumerate([4.0, 4.0, 5.0])] + [row(i, "GPU-2", "row_remap", 396, 1.0) for i in range(3)] \
        + [row(i, "GPU-1", "xid", 13, 13.0) for i in range(3)]
    res = write(store, ev(first))
    assert res.offered["health_event"] == 9 and res.written["health_event"] == 6
    # the next batch: GPU-1's counter repeats 5, then resets to 0 (not an event: zero readings never are) and reads 1
    write(store, ev([row(3, "GPU-1", "ecc", 312, 5.0), row(4, "GPU-2", "row_remap", 396, 1.0), row(5, "GPU-1", "ecc", 312, 1.0)]))
    got = store.read("health_event").sort("ts", "gpu_uuid", "kind")
    assert got.select("ts", "gpu_uuid", "kind", "value").rows() == [
        (t[0], "GPU-1", "ecc", 4.0), (t[0], "GPU-1", "xid", 13.0), (t[0], "GPU-2", "row_remap", 1.0),
        (t[1], "GPU-1", "xid", 13.0), (t[2], "GPU-1", "ecc", 5.0), (t[2], "GPU-1", "xid", 13.0), (t[5], "GPU-1", "ecc", 1.0)]
    # a reset to zero (seen in the samples: zero readings are no event) makes the same value new again
    t2 = [t[0] + dt.timedelta(minutes=1, seconds=s) for s in range(3)]
    write(store, F.Batch(gpu_sample=pl.DataFrame({"ts": t2[:2], "gpu_uuid": ["GPU-2"] * 2, "remap_pending": [1, 0]}),
                        health_event=ev([{**row(0, "GPU-2", "row_remap", 396, 1.0), "ts": t2[0]}]).health_event))
    again = write(store, ev([{**row(0, "GPU-2", "row_remap", 396, 1.0), "ts": t2[2]}]))
    assert again.written["health_event"] == 1
    # a write rolled back teaches the store nothing: the same reading is an event when it is written again
    real = store._log_ingest

    def fail(*a, **k):
        raise RuntimeError("disk full")

    store._log_ingest = fail
    with pytest.raises(RuntimeError):
        write(store, ev([row(0, "GPU-3", "ecc", 310, 2.0)]))
    store._log_ingest = real
    assert store.read("health_event", gpu_uuid="GPU-3").height == 0
    assert write(store, ev([row(1, "GPU-3", "ecc", 310, 2.0)])).written["health_event"] == 1


def _dbe_scrape(k: int, dbe: int, gpu: str = "GPU-r") -> F.Batch:
    """Scrape ``k`` of one GPU whose volatile double-bit ECC count reads ``dbe``, with the event a count above zero is."""
    from fleetscope.core import dcgm_fields

    sample = pl.DataFrame({"ts": [T0 + k * 10 * S], "gpu_uuid": [gpu], "power_w": [300.0], "ecc_dbe_volatile_total": [dbe]})
    events = dcgm_fields.dcgm_health_events(sample, pl.DataFrame({"gpu_uuid": [gpu], "host": ["h"]}), source="dcgm")
    return F.Batch(gpu_sample=sample, health_event=events)


@pytest.mark.parametrize("via", list(WRITES))
def test_a_count_read_again_after_a_reset_in_writes_without_events_is_a_new_event(db_url: str, via):
    """A GPU's volatile double-bit ECC count reads 1 (an event), then 0 for a while in writes that carry no health
    event at all (the node rebooted: nothing to report), then 1 again: a second uncorrectable error, stored as an
    event. So also for a process started after the first reading (its copy read from the table first)."""
    write = WRITES[via]
    scrape = _dbe_scrape

    first = Store.open(db_url)
    assert write(first, scrape(0, 1)).written["health_event"] == 1
    assert scrape(1, 0).health_event is None
    write(first, scrape(1, 0))
    write(first, scrape(2, 0))
    assert write(first, scrape(3, 1)).written["health_event"] == 1
    assert write(first, scrape(4, 1)).written.get("health_event", 0) == 0  # a repeat
    # a process started now learns the GPU's count from the table before its first write without events
    later = Store.open(db_url)
    write(later, scrape(5, 0))
    assert write(later, scrape(6, 1)).written["health_event"] == 1
    # zeros of a counter never seen above zero are no change to keep
    write(later, scrape(7, 0, gpu="GPU-calm"))
    with later.engine.connect() as conn:
        assert conn.exec_driver_sql("SELECT gpu_uuid, code, value FROM counter_reading").all() == [("GPU-r", 311, 1.0)]
    stored = first.read("health_event").sort("ts")
    assert stored["ts"].to_list() == [T0 + k * 10 * S for k in (0, 3, 6)]
    for st in (first, later):
        st.engine.dispose()


@pytest.mark.parametrize("via", list(WRITES))
def test_a_reset_that_reaches_another_process_is_recorded_once_its_copy_is_checked(db_url: str, via, monkeypatch):
    """Two API processes: B has read its copy of the counters (nothing above zero then); A then stores a GPU's
    double-bit count of 1. The node reboots and its agent reconnects to B, whose push reads 0 and carries no
    event. B's copy, older than ``REFRESH_S``, is checked against the table in that write, so the zero is recorded
    and the next count of 1, wherever it goes, is a new error. With a copy young enough not to be checked, the
    zero is missed and the second error would page nobody: the check is what records it."""
    from fleetscope.store import counters

    write = WRITES[via]
    for check in (True, False):
        with Store.open(db_url).engine.begin() as conn:
            conn.exec_driver_sql("DELETE FROM counter_reading")
            conn.exec_driver_sql("DELETE FROM health_event")
        a, b = Store.open(db_url), Store.open(db_url)
        write(b, _dbe_scrape(0, 0, gpu="GPU-other"))  # B's copy read: nothing above zero
        assert write(a, _dbe_scrape(1 + 10 * check, 1)).written["health_event"] == 1
        monkeypatch.setattr(counters, "REFRESH_S", 0.0 if check else 3600.0)
        write(b, _dbe_scrape(2 + 10 * check, 0))
        got = write(a, _dbe_scrape(3 + 10 * check, 1)).written.get("health_event", 0)
        assert got == (1 if check else 0), check
        for st in (a, b):
            st.engine.dispose()


def test_the_counter_decision_over_rows_is_the_one_over_frames():
    """``CounterMemory.changed_rows`` decides in Python what ``changed`` decides with frames: random batches of
    counter events and zero/nonzero sample readings (one instant twice, a GPU unknown, a known null, an XID and a
    host-level event among them) against random known readings give the same events kept and the same changes."""
    import random

    from fleetscope.store import counters
    from fleetscope.store.writing import Rows

    class _Conn:  # the table's newest version, as the memory's own: nothing read from a database, nothing written
        def execute(self, *_: object) -> None:
            pass

    rng = random.Random(7)
    gpus, codes = ["g0", "g1", "g2"], [310, 312, 396]
    for trial in range(300):
        known = {(g, c): rng.choice([None, 0.0, 1.0, 2.0]) for g in gpus for c in codes if rng.random() < 0.5}
        events = []
        for _ in range(rng.randint(0, 8)):
            g, c, t = rng.choice(gpus + [""]), rng.choice(codes + [13]), rng.randint(0, 3)
            kind = "xid" if c == 13 else ("row_remap" if c == 396 else "ecc")
            events.append((t, "h", g, kind, c, float(rng.randint(1, 3)), "m", "dcgm"))
        cols = {"ecc_sbe_volatile_total": 310, "ecc_sbe_aggregate_total": 312, "remap_pending": 396}
        samples = [(rng.randint(0, 3), g, *(rng.choice([None, 0, 1, 2]) for _ in cols)) for g in gpus for _ in range(rng.randint(0, 2))]
        samples = list({(r[0], r[1]): r for r in samples}.values())
        ev_rows = Rows(F.HEALTH_EVENT.names, events)
        sm_rows = Rows(("ts", "gpu_uuid", *cols), samples)
        memory = counters.CounterMemory("sqlite")
        memory._known, memory._version = known, 1
        got, got_changes = memory.changed_rows(_Conn(), ev_rows, sm_rows if samples else None, newest=1)
        ev_frame = ev_rows.frame(F.HEALTH_EVENT) if events else F.HEALTH_EVENT.empty()
        sm_frame = sm_rows.frame(F.GPU_SAMPLE) if samples else None
        want, want_changes = memory.changed(_Conn(), ev_frame, sm_frame, newest=1)
        kept = sorted(want.with_columns(pl.col("ts").dt.epoch("us")).rows())
        assert sorted(got.rows) == kept, trial
        assert sorted((got_changes or ([], 0))[0], key=repr) == sorted((want_changes or ([], 0))[0], key=repr), trial


def _counter_pushes() -> list[F.Batch]:
    """Agent-shaped pushes of 4 GPUs' DCGM samples over 40 scrapes: each GPU's SBE aggregate counter and pending
    row remaps rise, repeat, reset to zero and rise again on a schedule of its own, with the health events the
    exporter's readers make of them (dcgm_fields.dcgm_health_events)."""
    from fleetscope.core import dcgm_fields

    pushes = []
    for k in range(40):
        ts = T0 + k * 10 * S
        gpus = [f"GPU-{g}" for g in range(4)]
        sbe = [float((k // (3 + g)) % 5) for g in range(4)]  # steps up every 3..6 scrapes, back to 0 every fifth step
        pending = [float(k % (7 + g) >= 4) for g in range(4)]
        sample = pl.DataFrame({"ts": [ts] * 4, "gpu_uuid": gpus, "ecc_sbe_aggregate_total": sbe, "remap_pending": pending})
        events = dcgm_fields.dcgm_health_events(sample, pl.DataFrame({"gpu_uuid": gpus, "host": ["h"] * 4}), source="dcgm")
        pushes.append(F.Batch(gpu_sample=sample, health_event=events))
    return pushes


def _expected_counter_events(pushes: list[F.Batch]) -> list[tuple]:
    """The counter events one process stores, worked out by hand: a nonzero reading unlike the GPU's last."""
    last: dict[tuple[str, int], float] = {}
    out = []
    for b in pushes:
        for row in b.gpu_sample.iter_rows(named=True):
            for col, code in (("ecc_sbe_aggregate_total", 312), ("remap_pending", 396)):
                v = row[col]
                if v and last.get((row["gpu_uuid"], code)) != v:
                    out.append((row["ts"], row["gpu_uuid"], code, v))
                last[(row["gpu_uuid"], code)] = v
    return sorted(out)


@pytest.mark.parametrize("via", list(WRITES))
def test_two_stores_on_one_database_agree_on_which_counter_readings_are_new(db_url: str, tmp_path, via):
    """Two API processes behind one proxy share the counters' last readings through the database: pushes of the
    same GPUs sent to either in turn store the events one process would, no repeat and no lost change."""
    write = WRITES[via]
    pushes = _counter_pushes()
    expected = _expected_counter_events(pushes)
    assert len(expected) > 30  # the schedule makes many changes and many repeats
    stored = lambda st: sorted(st.read("health_event").select("ts", "gpu_uuid", "code", "value").rows())  # noqa: E731

    one_url = f"sqlite:///{tmp_path / 'one.db'}"
    from fleetscope.store import db

    db.upgrade(one_url)
    one = Store.open(one_url)
    for b in pushes:
        write(one, b)
    assert stored(one) == expected

    a, b_ = Store.open(db_url), Store.open(db_url)
    # interleaved unevenly, so each store's own copy is behind the other's changes most of the time
    for i, push in enumerate(pushes):
        write(a if i % 3 else b_, push)
    assert stored(a) == expected
    # what each store decided from is what the table holds: the last reading of every counter
    final = {(r["gpu_uuid"], c): r[col] for r in pushes[-1].gpu_sample.iter_rows(named=True)
             for col, c in (("ecc_sbe_aggregate_total", 312), ("remap_pending", 396))}
    with a.engine.connect() as conn:
        rows = conn.exec_driver_sql("SELECT gpu_uuid, code, value FROM counter_reading").all()
    assert {(g, c): v for g, c, v in rows} == final
    # a repeat of the last push through either store is no event
    for st in (a, b_):
        assert write(st, pushes[-1]).written.get("health_event", 0) == 0
    for st in (one, a, b_):
        st.engine.dispose()


@pytest.mark.parametrize("via", list(WRITES))
def test_concurrent_counter_writers_in_two_stores_store_each_change_once(db_url: str, via):
    """Two stores writing at once, each scrape split between them by GPU and the halves swapping stores every
    scrape: each GPU's readings arrive in time order but alternate between stores, and the stores' changes race
    for the next version (the writers of changed readings take turns). Every change is stored once."""
    from concurrent.futures import ThreadPoolExecutor

    pushes = _counter_pushes()
    expected = _expected_counter_events(pushes)
    a, b_ = Store.open(db_url), Store.open(db_url)

    def half(push: F.Batch, gpus: list[str]) -> F.Batch:
        keep = pl.col("gpu_uuid").is_in(gpus)
        events = push.health_event
        return F.Batch(gpu_sample=push.gpu_sample.filter(keep), health_event=None if events is None else events.filter(keep))

    with ThreadPoolExecutor(2) as pool:
        for k, push in enumerate(pushes):
            first, second = (a, b_) if k % 2 else (b_, a)
            list(pool.map(lambda job: WRITES[via](*job), [(first, half(push, ["GPU-0", "GPU-1"])), (second, half(push, ["GPU-2", "GPU-3"]))]))
    got = sorted(a.read("health_event").select("ts", "gpu_uuid", "code", "value").rows())
    assert got == expected
    a.engine.dispose()
    b_.engine.dispose()


def test_a_large_first_frame_is_rolled_back_with_the_rest(store):
    """All or nothing, whatever path a frame takes: on PostgreSQL new telemetry of 1,000 rows or more is
    COPYed straight into its table; a failure after it (here, logging the ingest) must undo it too."""
    t0 = dt.datetime(2026, 5, 1, tzinfo=dt.UTC)
    samples = pl.DataFrame({"ts": [t0 + dt.timedelta(seconds=i) for i in range(2000)], "gpu_uuid": ["GPU-x"] * 2000, "power_w": [300.0] * 2000})
    real = store._log_ingest

    def fail(*a, **k):
        raise RuntimeError("connection lost")

    store._log_ingest = fail
    with pytest.raises(RuntimeError):
        store.write(F.Batch(gpu_sample=samples))
    store._log_ingest = real
    assert store.counts()["gpu_sample"] == 0
    assert store.write(F.Batch(gpu_sample=samples)).written["gpu_sample"] == 2000
    assert store.write(F.Batch(gpu_sample=samples)).written.get("gpu_sample", 0) == 0  # re-sent: the COPY conflicts, the fallback skips


def test_gpu_sample_fills_fields_from_later_copies_and_never_overwrites(store: Store):
    """A scrape split over writes with different columns (the first a group's plain rows, all-null columns
    left out; the next a whole frame): the row gathers both halves; a later copy of a stored field changes
    nothing."""
    from fleetscope.store import Rows

    t = dt.datetime(2026, 3, 1, 12, tzinfo=dt.UTC)
    us = int(t.timestamp() * 1_000_000)
    half = Rows(("ts", "gpu_uuid", "temp_c"), [(us, "GPU-f", 61)])
    written = store.write_rows([(F.GPU_SAMPLE, half)], ingest_log=lambda r: [("a", None, r.written, 1)], values=1)
    assert written.written["gpu_sample"] == 1
    other = F.Batch(source="b", gpu_sample=pl.DataFrame({"ts": [t], "gpu_uuid": ["GPU-f"], "power_w": [300.0]}))
    assert store.write(other).written["gpu_sample"] == 1  # the row gained a field
    again = F.Batch(source="c", gpu_sample=pl.DataFrame({"ts": [t], "gpu_uuid": ["GPU-f"], "power_w": [999.0], "temp_c": [99]}))
    assert store.write(again).written["gpu_sample"] == 0  # nothing to fill: the stored values stay
    row = store.read("gpu_sample").row(0, named=True)
    assert (row["power_w"], row["temp_c"]) == (300.0, 61)
    assert store.read("gpu_sample").height == 1


def test_sqlite_checkpoints_in_the_background_not_in_commits(tmp_path, monkeypatch):
    """The API's store leaves checkpoints to its own thread: a commit only appends to the log (its
    connections' autocheckpoint is off), the thread then copies the pages into the database file, and what
    was committed reads back throughout. Stopping wakes the thread from its idle wait (made an hour here),
    as the API's shutdown must not wait that out."""
    import time

    from fleetscope.core.spec import conform
    from fleetscope.store import db as dbm
    from fleetscope.store import sqlite_wal

    monkeypatch.setattr(sqlite_wal, "IDLE_CHECKPOINT_S", 3600.0)

    url = f"sqlite:///{tmp_path / 'ck.db'}"
    dbm.upgrade(url)
    main = tmp_path / "ck.db"
    store = Store.open(url)
    store.checkpoint_in_background(interval_s=0.5)
    with store.engine.connect() as conn:
        assert conn.exec_driver_sql("PRAGMA wal_autocheckpoint").scalar() == 0
    before = main.stat().st_size
    rows = [{"ts": dt.datetime(2026, 1, 1, tzinfo=dt.UTC) + dt.timedelta(seconds=i), "gpu_uuid": f"GPU-{g}", "power_w": 100.0 + i}
            for i in range(500) for g in range(20)]  # ~2,500 pages: past the 1,000 where a commit would checkpoint
    store.write(F.Batch(source="t", gpu_sample=conform(F.GPU_SAMPLE, pl.DataFrame(rows))))
    assert main.stat().st_size == before  # the commit copied nothing back
    assert store.read("gpu_sample").height == 10_000
    deadline = time.monotonic() + 10
    # The file grows page by page while the thread copies, so wait for the whole copy, not its first page.
    while main.stat().st_size <= before + 1_000_000 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert main.stat().st_size > before + 1_000_000  # the thread did
    thread = store._checkpointer[0]
    store.stop_checkpointing()
    assert not thread.is_alive()
    assert store._checkpointer is None and store.read("gpu_sample").height == 10_000


def test_rows_with_nulls_are_written_as_given(store):
    """``Rows`` go to PostgreSQL as binary arrays (nulls among the values) and come back as given."""
    from fleetscope.store import Rows

    t = dt.datetime(2026, 3, 2, 12, tzinfo=dt.UTC)
    us = int(t.timestamp() * 1_000_000)
    rows = Rows(("ts", "gpu_uuid", "power_w", "temp_c"), [(us, "GPU-a", 300.5, 61), (us, "GPU-b", 301.0, None), (us, "GPU-c", None, 70)])
    written = store.write_rows([(F.GPU_SAMPLE, rows)], ingest_log=lambda r: [("mixed", None, r.written, 6)], values=6)
    assert written.written["gpu_sample"] == 3
    got = {r["gpu_uuid"]: (r["power_w"], r["temp_c"]) for r in store.read("gpu_sample", start=t).iter_rows(named=True)}
    assert got == {"GPU-a": (300.5, 61), "GPU-b": (301.0, None), "GPU-c": (None, 70)}


def test_an_idle_pooled_connection_that_died_is_replaced(db_url, monkeypatch):
    """PostgreSQL: a pooled connection idle past ``PING_AFTER_IDLE_S`` is pinged before use; one the
    server ended is replaced without the caller seeing an error. One back sooner is not pinged."""
    from sqlalchemy import text

    from fleetscope.store import db as dbm

    if not db_url.startswith("postgresql"):
        pytest.skip("SQLite connections are files")
    engine = dbm.make_engine(db_url)
    with engine.connect() as conn:
        pid = conn.execute(text("SELECT pg_backend_pid()")).scalar_one()
    with engine.connect() as conn:  # back at once: not pinged, same backend
        assert conn.execute(text("SELECT pg_backend_pid()")).scalar_one() == pid
    other = dbm.make_engine(db_url)
    with other.connect() as conn:
        assert conn.execute(text("SELECT pg_terminate_backend(:p)"), {"p": pid}).scalar_one()
    other.dispose()
    monkeypatch.setattr(dbm, "PING_AFTER_IDLE_S", 0.0)
    with engine.connect() as conn:  # the dead one fails its ping and a new one is used
        assert conn.execute(text("SELECT pg_backend_pid()")).scalar_one() != pid
    engine.dispose()


def _fleet_inventory(driver: str = "580.1") -> pl.DataFrame:
    return pl.DataFrame({"gpu_uuid": [f"g{i}" for i in range(6)], "host": ["n1"] * 3 + ["n2"] * 3, "gpu_index": [0, 1, 2] * 2,
                         "model_name": ["H100"] * 6, "driver_version": [driver] * 6})


def _gpu_upserts(store: Store, monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Rows of each gpu upsert ``store`` sends to the database from now on."""
    sent: list[int] = []
    insert = store._insert

    def counting(conn, table, df, key, on_conflict):  # type: ignore[no-untyped-def]
        if table == "gpu":
            sent.append(df.height)
        return insert(conn, table, df, key, on_conflict)

    monkeypatch.setattr(store, "_insert", counting)
    return sent


def test_an_unchanged_inventory_is_not_upserted_again(store: Store, monkeypatch: pytest.MonkeyPatch):
    sent = _gpu_upserts(store, monkeypatch)
    results = [store.write(F.Batch(source="scrape", gpu=_fleet_inventory())).written["gpu"] for _ in range(4)]
    # The first write stores it, the second finds it stored (and remembers), the rest skip the upsert.
    assert results == [6, 0, 0, 0] and sent == [6, 6]
    # A frame that differs is upserted, and what it changes is stored.
    assert store.write(F.Batch(source="scrape", gpu=_fleet_inventory("580.2"))).written["gpu"] == 6
    assert sent == [6, 6, 6]
    assert store.query("SELECT DISTINCT driver_version FROM gpu").rows() == [("580.2",)]


@pytest.mark.parametrize("change", ["another store", "sql update", "sql delete"])
def test_an_inventory_changed_elsewhere_is_written_again(store: Store, monkeypatch: pytest.MonkeyPatch, change: str):
    """A process that remembers the inventory as stored still sees another process's change to it, and its
    next scrape puts its own values back, as the upsert would."""
    for _ in range(2):
        store.write(F.Batch(source="scrape", gpu=_fleet_inventory()))
    sent = _gpu_upserts(store, monkeypatch)
    assert store.write(F.Batch(source="scrape", gpu=_fleet_inventory())).written["gpu"] == 0 and sent == []  # remembered
    if change == "another store":
        other = Store(store.engine)  # another process: nothing remembered
        moved = _fleet_inventory().with_columns(host=pl.when(pl.col("gpu_uuid") == "g4").then(pl.lit("n9")).otherwise("host"))
        assert other.write(F.Batch(source="admin", gpu=moved)).written["gpu"] == 1
    else:
        with store.engine.begin() as conn:
            conn.exec_driver_sql("UPDATE gpu SET host = 'n9' WHERE gpu_uuid = 'g4'" if change == "sql update" else
                                 "DELETE FROM gpu WHERE gpu_uuid = 'g4'")
    assert store.write(F.Batch(source="scrape", gpu=_fleet_inventory())).written["gpu"] == 1
    assert sent == [6]
    assert store.query("SELECT gpu_uuid, host FROM gpu ORDER BY gpu_uuid").rows() == [
        ("g0", "n1"), ("g1", "n1"), ("g2", "n1"), ("g3", "n2"), ("g4", "n2"), ("g5", "n2")]


def test_the_duplicate_check_reads_the_fault_counters_version_with_it(store: Store):
    """PostgreSQL: a write carrying health events reads the fault counters' newest version in the duplicate
    check's round trip; what it reads is the table's."""
    with store.engine.begin() as conn:
        conn.exec_driver_sql("INSERT INTO counter_reading (gpu_uuid, code, value, version) VALUES ('g0', 310, 1.0, 7), ('g1', 310, 2.0, 9)")
    with store.engine.begin() as conn:
        got = ingest_log.refuse_logged(conn, store.dialect, ["a" * 64], counters=True)
        assert got == (9 if store.dialect == "postgresql" else None)
        assert ingest_log.refuse_logged(conn, store.dialect, ["a" * 64]) is None


def test_metric_rows_with_new_series_are_written_with_their_ids_and_a_logged_input_leaves_no_series(store: Store):
    """``write_rows`` of metric samples whose series the process has never seen (a node's first push): the
    series are created and the samples stored under their ids, and the process remembers exactly the ids the
    database gave; a re-sent input (its hash logged) is refused whole and leaves no series behind, and a
    second process that did not create a series still stores its samples under the one id."""
    from fleetscope.store import AlreadyLogged, Rows

    us = int(dt.datetime(2026, 3, 1, 12, tzinfo=dt.UTC).timestamp() * 1_000_000)
    keys = [f'DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL{{gpu_uuid="GPU-{i}"}}' for i in range(5)]
    rows = Rows(("ts", "series", "value"), [(us + k * 10_000_000, key, float(i * 10 + k)) for i, key in enumerate(keys) for k in range(3)])
    log = lambda r: [("agent", "sha-first", r.written, 15)]  # noqa: E731
    assert store.write_rows([(F.METRIC_SAMPLE, rows)], ingest_log=log, values=15, unless_logged=["sha-first"]).written["metric_sample"] == 15
    stored = store.query("SELECT series_id, series FROM series", [], {"series_id": pl.Int64, "series": pl.String})
    assert dict(zip(stored["series"], stored["series_id"])) == {k: store._series_cache[k] for k in keys}
    samples = store.read("metric_sample")
    assert samples.height == 15 and sorted(samples["value"].to_list()) == sorted(float(i * 10 + k) for i in range(5) for k in range(3))

    more = Rows(("ts", "series", "value"), [(us, 'site_power_w{site="new"}', 1.0)])
    with pytest.raises(AlreadyLogged):
        store.write_rows([(F.METRIC_SAMPLE, more)], ingest_log=log, values=1, unless_logged=["sha-first"])
    assert store.query("SELECT COUNT(*) AS n FROM series", [], {"n": pl.Int64})["n"][0] == 5
    assert 'site_power_w{site="new"}' not in store._series_cache

    other = Store.open(store.engine.url.render_as_string(hide_password=False))  # another process: no ids known
    try:
        later = Rows(("ts", "series", "value"), [(us + 60_000_000, keys[0], 7.0), (us + 60_000_000, 'site_power_w{site="new"}', 1.0)])
        assert other.write_rows([(F.METRIC_SAMPLE, later)], ingest_log=lambda r: [("b", "sha-b", r.written, 2)], values=2,
                                unless_logged=["sha-b"]).written["metric_sample"] == 2
        assert other._series_cache[keys[0]] == store._series_cache[keys[0]]
        got = store.query("SELECT m.value FROM metric_sample m JOIN series s ON s.series_id = m.series_id WHERE s.series = ?", [keys[0]],
                          {"value": pl.Float64})
        assert sorted(got["value"].to_list()) == [0.0, 1.0, 2.0, 7.0]
    finally:
        other.engine.dispose()


def test_postgresql_reads_run_without_jit_and_keep_the_urls_own_options(store: Store):
    """A panel's statement of many short probes is costed as one and crossed the JIT threshold, compiling for a
    second what ran in milliseconds; the bulk reads' sessions turn JIT off, keeping any ``options`` of the URL
    (percent-encoded: a space written as "+" reads as part of a setting's name)."""
    if store.dialect != "postgresql":
        pytest.skip("PostgreSQL's JIT")
    from fleetscope.store import _no_jit_url

    settings = "SELECT current_setting('jit') AS jit, current_setting('statement_timeout') AS timeout"
    with store.engine.connect() as conn:  # the writer's own sessions keep the server's settings (JIT on by default)
        server_timeout = conn.exec_driver_sql("SHOW statement_timeout").scalar()
    assert store.query(settings).rows() == [("off", server_timeout)]
    with_options = store.reader.url.update_query_dict({"options": "-c statement_timeout=7s"})
    import connectorx as cx

    got = cx.read_sql(_no_jit_url(with_options), settings, return_type="polars")
    assert got.rows() == [("off", "7s")]
