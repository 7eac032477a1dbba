"""Closed days of the per-GPU energy minutes packed into per-(GPU, hour) arrays (store/packed_energy.py,
services/packing.py, migration 0025): on PostgreSQL a packed day reads back exactly as its rows did through every
read of energy minutes; a minute re-rolled after the pack wins over its packed copy and is folded in by the next
pack; retention prunes packed hours. SQLite never packs and reads the same."""

from __future__ import annotations

import datetime as dt

import numpy as np
import polars as pl
import pytest
from sqlalchemy import text

from fleetscope.core import frames as F
from fleetscope.services import energy, energy_reads, energy_rollup, packing, pipeline, retention, telemetry
from fleetscope.store import packed_energy

DAY = dt.datetime(2026, 10, 1, tzinfo=dt.UTC)
GPUS = [f"GPU-{g:04d}" for g in range(4)]
H = dt.timedelta(hours=1)


def _minutes() -> pl.DataFrame:
    """Two days of minutes for four GPUs: counter and integrated parts with mJ digits, partial coverage, GPU 3
    silent from 05:00 to 07:00 on day one and without an energy counter (NULL counter part), GPU 2's method
    changing through the day."""
    rng = np.random.default_rng(7)
    minutes = [DAY + dt.timedelta(minutes=m) for m in range(2 * 1440)]
    frames = []
    for g, uuid in enumerate(GPUS):
        n = len(minutes)
        counter = np.round(20_000 + 20_000 * rng.random(n), 3)
        integrated = np.round(100 * rng.random(n), 3)
        covered = np.where(rng.random(n) < 0.95, 60.0, np.round(60 * rng.random(n), 6))
        df = pl.DataFrame({"minute": minutes, "gpu_uuid": [uuid] * n, "counter_energy_j": counter, "integrated_energy_j": integrated,
                           "covered_s": covered, "method": ["counter+power_integration"] * n})
        if g == 3:
            df = df.filter(~pl.col("minute").is_between(DAY + 5 * H, DAY + 7 * H, closed="left"))
            df = df.with_columns(counter_energy_j=pl.lit(None, pl.Float64), method=pl.lit("power_integration"))
        if g == 2:
            df = df.with_columns(method=pl.when(pl.col("minute").dt.minute() % 5 == 0).then(pl.lit("counter")).otherwise(pl.col("method")))
        frames.append(df.with_columns(energy_j=pl.col("counter_energy_j").fill_null(0.0) + pl.col("integrated_energy_j")))
    return F.conform(F.GPU_ENERGY_MINUTE, pl.concat(frames))


def _write(store, df: pl.DataFrame) -> None:  # type: ignore[no-untyped-def]
    inv = pl.DataFrame({"gpu_uuid": GPUS, "host": ["h0", "h0", "h1", "h1"], "gpu_index": [0, 1, 0, 1]})
    hosts = pl.DataFrame({"host": ["h0", "h1"], "site_id": ["s1", "s2"]})
    site = pl.DataFrame({"site_id": ["s1", "s2"], "name": ["one", "two"], "country": ["DEU", "FRA"]})
    store.write(F.Batch(source="t", site=F.conform(F.SITE, site), host=F.conform(F.HOST, hosts), gpu=F.conform(F.GPU, inv),
                        gpu_energy_minute=df))


def _reads(store) -> dict[str, object]:  # type: ignore[no-untyped-def]
    """Every read of energy minutes, over ranges inside day one, across its end, off the hour and unbounded."""
    return {
        "all": store.read("gpu_energy_minute"),
        "range": store.read("gpu_energy_minute", start=DAY + dt.timedelta(hours=4, minutes=30), end=DAY + dt.timedelta(days=1, hours=2)),
        "gpus": store.read("gpu_energy_minute", gpu_uuid=[GPUS[1], GPUS[3]], start=DAY + dt.timedelta(minutes=17), end=DAY + 9 * H),
        "columns": store.read("gpu_energy_minute", columns=["minute", "energy_j"], start=DAY + 23 * H, end=DAY + 25 * H),
        "inside_hour": store.read("gpu_energy_minute", start=DAY + dt.timedelta(hours=10, minutes=7), end=DAY + dt.timedelta(hours=10, minutes=41)),
        "from": store.read("gpu_energy_minute", start=DAY + dt.timedelta(hours=30, minutes=1)),
        "to": store.read("gpu_energy_minute", end=DAY + dt.timedelta(hours=2, minutes=59)),
        # a naive bound is UTC, as on every read
        "naive": store.read("gpu_energy_minute", start=dt.datetime(2026, 10, 1, 10, 30), end=dt.datetime(2026, 10, 1, 12, 15)),
        # the oldest rows: read in growing windows on PostgreSQL, never by unpacking every hour (Store._read_oldest)
        "oldest": store.read("gpu_energy_minute", limit=9),
        "oldest_of_gpu": store.read("gpu_energy_minute", gpu_uuid=[GPUS[3]], start=DAY + dt.timedelta(hours=4, minutes=58), limit=200),
        "limit_by_gpu": store.read("gpu_energy_minute", columns=["gpu_uuid"], limit=3),
        "site_hour": energy_reads.energy_by_site_hour(store, DAY + 2 * H, DAY + 30 * H),
        "site_minutes": energy.site_minutes(store, DAY + 20 * H, DAY + 21 * H, ["s1", "s2"]),
        "report": energy.energy_report(store, DAY, DAY + 2 * 24 * H, ["site_id", "hour"]),
        "rolled_to": energy_rollup.energy_rollup_end(store),
    }


def _assert_same(before: dict[str, object], after: dict[str, object]) -> None:
    from polars.testing import assert_frame_equal

    for name, b in before.items():
        a = after[name]
        if not isinstance(b, pl.DataFrame):
            assert a == b, name
        elif name in ("site_hour", "site_minutes", "report"):
            # sums of the same minutes, added in another order: equal to the last few bits
            assert_frame_equal(a, b, check_exact=False, rel_tol=1e-13, abs_tol=0.0)
        else:
            # the minutes themselves exactly (those of one minute come in no set order without the GPU in the read)
            assert a.sort(a.columns).equals(b.sort(b.columns)), name


def _packed(store) -> pl.DataFrame:  # type: ignore[no-untyped-def]
    """Two days of minutes written and both packed (PostgreSQL; SQLite does not pack): the minutes written."""
    if store.dialect == "sqlite":
        pytest.skip("SQLite does not pack")
    df = _minutes()
    _write(store, df)
    packing.pack_energy_closed(store, DAY + dt.timedelta(days=3))
    return df


def _raw_rows(store) -> int:  # type: ignore[no-untyped-def]
    with store.engine.connect() as conn:
        return int(conn.execute(text("SELECT count(*) FROM gpu_energy_minute")).scalar())


def test_a_packed_day_of_energy_minutes_reads_back_exactly_through_every_read(store):
    df = _minutes()
    _write(store, df)
    before = _reads(store)
    assert before["all"].height == df.height and before["site_hour"].height > 0 and before["report"].height > 0
    # each range exactly, on both databases: its source applies the bounds
    assert before["inside_hour"].height == 4 * 34 and before["to"].height == 4 * 179 and before["naive"].height == 4 * 105
    assert before["range"].equals(df.filter(pl.col("minute").is_between(DAY + dt.timedelta(hours=4, minutes=30), DAY + 26 * H, closed="left"))
                                  .sort("minute", "gpu_uuid"))
    assert before["rolled_to"] == DAY + dt.timedelta(days=2)

    now = DAY + dt.timedelta(days=3)
    waiting = pipeline.status(store, now, tasks=False)
    assert waiting["energy_packing_pending_days"] == ([] if store.dialect == "sqlite" else ["2026-10-01", "2026-10-02"])
    assert ("energy pack 0 closed day(s)" if store.dialect == "sqlite" else "energy pack 2 closed day(s) of energy minutes waiting: 2026-10-01, 2026-10-02") \
        in pipeline.describe(waiting, [])
    done = packing.pack_energy_closed(store, now)
    assert pipeline.status(store, now, tasks=False)["energy_packing_pending_days"] == []
    if store.dialect == "sqlite":
        assert done == {}
        _assert_same(before, _reads(store))
        return
    day1, day2 = (df.filter(pl.col("minute").dt.date() == d.date()) for d in (DAY, DAY + 24 * H))
    # GPU 3 is silent for two hours of day one: no row for those GPU-hours
    assert done == {"2026-10-01": {"minutes": day1.height, "rows": 4 * 24 - 2}, "2026-10-02": {"minutes": day2.height, "rows": 4 * 24}}
    assert _raw_rows(store) == 0
    with store.engine.connect() as conn:
        packed_rows, nulls = conn.execute(text(f"SELECT count(*), count(*) FILTER (WHERE counter_energy_j[1] IS NULL) FROM {packed_energy.TABLE}")).one()
    assert packed_rows == 8 * 24 - 2 and nulls == 2 * 24 - 2  # GPU 3's counter part is NULL, minute by minute
    _assert_same(before, _reads(store))
    with store.engine.begin() as conn:
        conn.execute(text(f"ANALYZE {packed_energy.TABLE}"))
    # the data overview's estimate counts the packed minutes (every packed hour here holds all 60), and so do the counts
    assert telemetry.table_rows(store, ["gpu_energy_minute"])["rows"].to_list() == [df.height]
    assert store.counts()["gpu_energy_minute"] == df.height
    # nothing is left to pack
    assert packing.pack_energy_closed(store, DAY + dt.timedelta(days=3)) == {}


def test_a_minute_re_rolled_after_its_pack_wins_and_the_next_pack_folds_it_in(store):
    df = _packed(store)
    at = DAY + dt.timedelta(hours=10, minutes=7)
    changed = df.filter((pl.col("minute") == at) & (pl.col("gpu_uuid") == GPUS[0])).with_columns(
        energy_j=pl.lit(1.5), counter_energy_j=pl.lit(1.0), integrated_energy_j=pl.lit(0.5), method=pl.lit("counter+power_integration"))
    store.write(F.Batch(source="re-roll", gpu_energy_minute=changed))
    expected = df.update(changed, on=["minute", "gpu_uuid"]).sort("minute", "gpu_uuid")
    got = store.read("gpu_energy_minute")
    assert got.height == df.height  # the re-rolled minute once, not beside its packed copy
    assert got.equals(expected)
    hour = store.read("gpu_energy_minute", start=DAY + 10 * H, end=DAY + 11 * H, gpu_uuid=[GPUS[0]])
    assert hour["energy_j"].sum() == expected.filter((pl.col("minute") >= DAY + 10 * H) & (pl.col("minute") < DAY + 11 * H)
                                                     & (pl.col("gpu_uuid") == GPUS[0]))["energy_j"].sum()
    assert _raw_rows(store) == 1
    done = packing.pack_energy_closed(store, DAY + dt.timedelta(days=3))
    assert done == {"2026-10-01": {"minutes": 1, "rows": 4}}  # the hour's four GPUs packed again, with the new minute
    assert _raw_rows(store) == 0
    assert store.read("gpu_energy_minute").equals(expected)


def test_retention_prunes_packed_energy_hours_with_the_rows(store):
    df = _minutes()
    _write(store, df)
    packing.pack_energy_closed(store, DAY + dt.timedelta(days=1, hours=2))  # day one only: day two has not ended
    cutoff = DAY + dt.timedelta(hours=6, minutes=30)
    # evidence retention: the cutoff above, from a "now" three years and a bit on
    now = cutoff + dt.timedelta(days=1095)
    deleted = retention.prune(store, now, retention_days=1095, evidence_retention_days=1095)
    left = store.read("gpu_energy_minute")
    if store.dialect == "sqlite":
        assert left["minute"].min() == cutoff and deleted["gpu_energy_minute"] == df.filter(pl.col("minute") < cutoff).height
        return
    # packed: whole hours ending by the cutoff (00:00-06:00; GPU 3 had none at 05:00); the 06:00 hour stays whole
    assert deleted[packed_energy.TABLE] == 4 * 6 - 1
    assert left["minute"].min() == DAY + 6 * H
    assert left.equals(df.filter(pl.col("minute") >= DAY + 6 * H).sort("minute", "gpu_uuid"))


def test_downgrading_past_0025_puts_the_packed_minutes_back_as_rows(store):
    from fleetscope.store import db

    df = _packed(store)
    assert _raw_rows(store) == 0
    url = store.engine.url.render_as_string(hide_password=False)
    store.engine.dispose()
    try:
        db.downgrade(url, "0024")
        # read by plain SQL: this code's reads expect the packed table of head
        back = store.query(f"SELECT minute, gpu_uuid, {', '.join(packed_energy.FIELDS)} FROM gpu_energy_minute ORDER BY minute, gpu_uuid",
                           [], dict(F.GPU_ENERGY_MINUTE.schema))
        assert back.select(df.columns).equals(df.sort("minute", "gpu_uuid"))
    finally:
        db.upgrade(url)  # the session's database is shared with later tests


def test_db_pack_packs_the_backlog_beat_would_take_ticks_over(store, tmp_path):
    """``fleetscope db pack``: every closed day at once, oldest first (beat packs two a tick), or ``--days`` of
    them; then nothing is left, and the reads are the rows' reads."""
    import json
    import os

    from tests.clirun import cli

    if store.dialect == "sqlite":
        proc = cli("db", "pack", env={**os.environ, "FLEETSCOPE_DATABASE_URL": store.engine.url.render_as_string(hide_password=False),
                                      "FLEETSCOPE_DATA_DIR": str(tmp_path)})
        assert proc.returncode == 0 and "SQLite keeps every day as rows" in proc.stdout
        return
    df = _minutes()
    _write(store, df)
    before = _reads(store)
    env = {**os.environ, "FLEETSCOPE_DATABASE_URL": store.engine.url.render_as_string(hide_password=False), "FLEETSCOPE_DATA_DIR": str(tmp_path)}
    first = cli("db", "pack", "--days", "1", "--json", env=env)
    assert first.returncode == 0, first.stderr
    day1 = df.filter(pl.col("minute") < DAY + 24 * H)
    assert json.loads(first.stdout) == {"gpu_energy_minute": {"2026-10-01": {"minutes": day1.height, "rows": 4 * 24 - 2}}}
    rest = cli("db", "pack", env=env)
    assert rest.returncode == 0, rest.stderr
    assert "gpu_energy_minute    2026-10-02" in rest.stdout and f"{df.height - day1.height:,} packed into" in rest.stdout
    assert _raw_rows(store) == 0
    assert "every closed day is packed" in cli("db", "pack", env=env).stdout
    _assert_same(before, _reads(store))
