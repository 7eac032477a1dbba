"""Raw telemetry partitioned by day on PostgreSQL (store/partitions.py, migration 0016): writes through COPY and
INSERT ... ON CONFLICT route to partitions and stay idempotent, retention drops whole partitions, beat makes
them ahead; SQLite keeps plain tables with the same results."""

from __future__ import annotations

import datetime as dt

import polars as pl
from sqlalchemy import text

from fleetscope.core import frames as F
from fleetscope.services import retention
from fleetscope.store import partitions, schema

T0 = dt.datetime(2026, 10, 1, tzinfo=dt.UTC)


def _samples(days: int, gpus: int = 8, every_s: int = 3600) -> pl.DataFrame:
    rows = [{"ts": T0 + dt.timedelta(seconds=s), "gpu_uuid": f"GPU-{g:04d}", "power_w": 400.0 + g, "util_ratio": 0.5}
            for s in range(0, days * 86400, every_s) for g in range(gpus)]
    return F.conform(F.GPU_SAMPLE, pl.DataFrame(rows))


def test_writes_route_to_day_partitions_and_stay_idempotent(store):
    df = _samples(3, gpus=16, every_s=120)  # 3 days x 720 x 16 = 34,560 rows: the COPY path
    first = store.write_frames([(F.GPU_SAMPLE, df)], source="a")
    assert first.written["gpu_sample"] == df.height
    again = store.write_frames([(F.GPU_SAMPLE, df)], source="a")  # COPY fails on the key, ON CONFLICT skips
    assert again.written["gpu_sample"] == 0
    small = df.head(10).with_columns(pl.col("ts") + dt.timedelta(days=5))  # a small write: INSERT ... ON CONFLICT
    assert store.write_frames([(F.GPU_SAMPLE, small)], source="b").written["gpu_sample"] == 10
    assert store.read("gpu_sample").height == df.height + 10
    if store.dialect == "postgresql":
        parts = partitions.partitions(store.engine, "gpu_sample")
        assert {dt.date(2026, 10, 1), dt.date(2026, 10, 2), dt.date(2026, 10, 3), dt.date(2026, 10, 6)} <= {d for _, d in parts}
        every = partitions.all_partitions(store.engine)
        assert {"gpu_sample_p20261001", "gpu_sample_p20261006"} <= set(every) and set(every) >= {n for n, _ in parts}
        assert all(partitions.is_partition(n) for n in every) and every == sorted(every)
        with store.engine.connect() as conn:
            n = conn.execute(text(f'SELECT count(*) FROM "{partitions.partition_name("gpu_sample", dt.date(2026, 10, 2))}"')).scalar()
            kind = conn.execute(text("SELECT c.relkind FROM pg_class c WHERE c.relname = 'gpu_sample'")).scalar()
            brin = conn.execute(text("SELECT am.amname FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid JOIN pg_am am ON am.oid = c.relam"
                                     " WHERE c.relname = 'ix_gpu_sample_ts_brin'")).scalar()
        assert n == 720 * 16 and kind == "p" and brin == "brin"


def test_metric_samples_rows_path_creates_partitions(store):
    from fleetscope.store import Rows

    day = T0 + dt.timedelta(days=40)
    us = int((day - F.EPOCH if hasattr(F, "EPOCH") else day - dt.datetime(1970, 1, 1, tzinfo=dt.UTC)).total_seconds()) * 1_000_000
    r = Rows(("ts", "series"  , "value"), [(us, 'site_power_w{site="a"}', 1.0), (us + 86_400_000_000, 'site_power_w{site="a"}', 2.0)])
    out = store.write_rows([(F.METRIC_SAMPLE, r)], ingest_log=lambda res: [("t", None, res.written, 2)])
    assert out.written["metric_sample"] == 2
    if store.dialect == "postgresql":
        days = [d for _, d in partitions.partitions(store.engine, "metric_sample")]
        assert day.date() in days and (day + dt.timedelta(days=1)).date() in days


def test_retention_drops_whole_day_partitions(store):
    df = _samples(4)  # 4 days, 24 hourly samples x 8 GPUs a day
    store.write_frames([(F.GPU_SAMPLE, df)], source="a")
    # raw retention 400 days at a cutoff of T0 + 2.5 days: two whole days and half the third go
    now = T0 + dt.timedelta(days=400, hours=60)
    deleted = retention.prune(store, now, 400, 1095)
    assert deleted["gpu_sample"] == (2 * 24 + 12) * 8
    left = store.read("gpu_sample")
    assert left.height == df.height - deleted["gpu_sample"] and left["ts"].min() == T0 + dt.timedelta(hours=60)
    if store.dialect == "postgresql":
        days = [d for _, d in partitions.partitions(store.engine, "gpu_sample")]
        assert dt.date(2026, 10, 1) not in days and dt.date(2026, 10, 2) not in days and dt.date(2026, 10, 3) in days
        # a later write to a dropped day makes its partition again
        assert store.write_frames([(F.GPU_SAMPLE, df.head(8))], source="late").written["gpu_sample"] == 8


def test_beat_makes_partitions_ahead(store):
    made = partitions.ensure_ahead(store.engine, dt.date(2027, 1, 30))
    if store.dialect != "postgresql":
        assert made == {}
        return
    assert made["gpu_sample"] == [f"gpu_sample_p202701{d}" for d in (30, 31)] + ["gpu_sample_p20270201", "gpu_sample_p20270202"]
    assert set(made) == set(partitions.PARTITIONED)
    assert partitions.ensure_ahead(store.engine, dt.date(2027, 1, 30))["gpu_sample"] == []  # already there
    assert partitions.is_partition("gpu_sample_p20270130") and not partitions.is_partition("gpu_sample_minute")


def test_a_partition_dropped_behind_the_stores_back_is_made_again(store):
    df = _samples(1)
    store.write_frames([(F.GPU_SAMPLE, df)], source="a")
    if store.dialect != "postgresql":
        return
    with store.engine.begin() as conn:  # another process's retention, or a rebuilt schema
        conn.execute(text(f'DROP TABLE "{partitions.partition_name("gpu_sample", T0.date())}"'))
    assert store.write_frames([(F.GPU_SAMPLE, df)], source="again").written["gpu_sample"] == df.height


def test_nothing_the_analyses_or_alerting_write_per_event_is_kept_forever(store):
    """nccl-tests results, the what-if analysis' per-op timings and Kineto traces' HTA unions go with the raw tier; the alert notifications sent
    and their delivery attempts with the evidence (each young row stays)."""
    old, young = T0, T0 + dt.timedelta(days=1000)
    nccl = pl.DataFrame({"run_id": ["r-old", "r-young"], "op": ["all_reduce"] * 2, "size_bytes": [1 << 20] * 2, "in_place": [False] * 2,
                         "ts": [old, young], "busbw_gbps": [180.0, 181.0]})
    ops = pl.DataFrame({"job_id": ["j"] * 2, "step": [1, 2], "rank": [0, 0], "optype": ["optimizer"] * 2, "seq_id": [0, 0],
                        "ts": [old, young], "duration_s": [0.01, 0.02]})
    unions = pl.DataFrame({"job_id": ["j"] * 2, "rank": [0, 0], "start": [old, young], "window": ["all"] * 2, "events": [3, 4],
                           "span_us": [9.0] * 2, "busy_us": [8.0] * 2, "compute_us": [5.0] * 2, "comm_us": [2.0] * 2, "overlap_us": [1.0] * 2})
    store.write_frames([(F.NCCL_TEST, F.conform(F.NCCL_TEST, nccl)), (F.JOB_OP, F.conform(F.JOB_OP, ops)),
                        (F.DEVICE_UNION, F.conform(F.DEVICE_UNION, unions))], source="t")
    with store.engine.begin() as conn:  # through the tables' types: instants are integers on SQLite
        for nid, at, status in ((1, old, "delivered"), (2, young, "delivered"), (3, old, "pending")):
            conn.execute(schema.metadata.tables["alert_notification"].insert().values(
                notification_id=nid, webhook_id=f"wh-{nid}", receiver="ops", group_key="g", status=status, payload_json="{}",
                created_at=at, attempts=1))
            conn.execute(schema.metadata.tables["alert_delivery_attempt"].insert().values(
                notification_id=nid, attempt=1, at=at + dt.timedelta(seconds=2), outcome="delivered"))
    # raw retention 400 days, evidence 1,095, three years and a bit after the old rows
    deleted = retention.prune(store, old + dt.timedelta(days=1100), 400, 1095)
    assert deleted["nccl_test"] == 1 and deleted["job_op"] == 1 and deleted["device_union"] == 1  # a Kineto trace's HTA unions
    assert store.read("device_union")["events"].to_list() == [4]
    assert deleted["alert_delivery_attempt"] == 2 and deleted["alert_notification"] == 1
    assert store.read("nccl_test")["run_id"].to_list() == ["r-young"] and store.read("job_op")["step"].to_list() == [2]
    with store.engine.connect() as conn:
        # one still waiting to be sent stays, however old
        assert conn.execute(text("SELECT notification_id FROM alert_notification ORDER BY 1")).scalars().all() == [2, 3]
        assert conn.execute(text("SELECT notification_id FROM alert_delivery_attempt ORDER BY 1")).scalars().all() == [2]
