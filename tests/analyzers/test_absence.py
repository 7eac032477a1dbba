"""Absence: silent GPUs, hosts down, a site gone quiet at once, and outages longer than a sweep's window."""

import datetime as dt
import json

import polars as pl

from analyzers import absence

T0 = dt.datetime(2026, 11, 30, 12, 0, tzinfo=dt.UTC)
INV = pl.DataFrame({"gpu_uuid": [f"GPU-{h}-{g}" for h in range(6) for g in range(2)], "host": [f"n{h}" for h in range(6) for _ in range(2)]})


def samples(stop: dict[str, int], *, minutes: int = 15, every_s: int = 10) -> pl.DataFrame:
    """10-s samples of every inventory GPU over ``minutes``; a GPU in ``stop`` stops after that many seconds."""
    rows = []
    for g in INV["gpu_uuid"]:
        for t in range(0, minutes * 60, every_s):
            if t < stop.get(g, 10**9):
                rows.append({"ts": T0 + dt.timedelta(seconds=t), "gpu_uuid": g})
    return pl.DataFrame(rows, schema={"ts": pl.Datetime("us", "UTC"), "gpu_uuid": pl.String})


END = T0 + dt.timedelta(minutes=15)


def test_last_seen_reads_each_gpus_own_interval():
    seen = absence.last_seen(samples({"GPU-0-0": 300}), INV)
    r = seen.filter(pl.col("gpu_uuid") == "GPU-0-0").row(0, named=True)
    assert r["last_ts"] == T0 + dt.timedelta(seconds=290) and r["interval_s"] == 10.0 and r["host"] == "n0"


def test_one_gpu_silent_is_gpu_absent_a_whole_host_is_host_down():
    s = samples({"GPU-0-0": 300, "GPU-1-0": 600, "GPU-1-1": 600})
    f = absence.absence_findings(absence.last_seen(s, INV), now=END)
    got = {(r["kind"], r["subject"], r["severity"]) for r in f.to_dicts()}
    assert got == {("gpu_absent", "gpu:GPU-0-0", "warning"), ("host_down", "host:n1", "critical")}
    down = f.filter(pl.col("kind") == "host_down").row(0, named=True)
    assert down["window_start"] == T0 + dt.timedelta(seconds=590)  # its last sample: the outage's start
    # measured against the fleet's newest sample (890 s), not the wall clock: late data is not silence
    assert json.loads(down["evidence"])["silent_s"] == 300.0


def test_a_short_gap_is_not_absence():
    # 100 s of silence: past 3 intervals of 10 s, but under the 120 s floor that rides out a slow scrape
    s = samples({"GPU-2-0": 800, "GPU-2-1": 800})
    assert absence.absence_findings(absence.last_seen(s, INV), now=END).height == 0
    # a whole site sampled once a minute is judged by the wall clock against its own interval (3 min)
    sites = pl.DataFrame({"host": [f"n{h}" for h in range(6)], "site_id": ["a"] * 6})
    slow = absence.last_seen(samples({}, every_s=60).filter(pl.col("ts") <= T0 + dt.timedelta(minutes=12)), INV)
    assert absence.absence_findings(slow, now=END, host_site=sites).height == 0
    f = absence.absence_findings(slow, now=END + dt.timedelta(seconds=1), host_site=sites)
    assert f.select("kind", "subject").rows() == [("site_silent", "site:a")]


def test_late_or_replayed_data_is_not_absence_but_a_fleet_gone_quiet_is():
    # the whole fleet's data is an hour old (a backfill, an agent catching up): no member lags its peers
    seen = absence.last_seen(samples({}), INV)
    assert absence.absence_findings(seen, now=END + dt.timedelta(hours=1)).height == 0
    # with the sites known, the wall clock says each site is silent: one finding per site, not per host
    sites = pl.DataFrame({"host": [f"n{h}" for h in range(6)], "site_id": ["a"] * 4 + ["b"] * 2})
    f = absence.absence_findings(seen, now=END + dt.timedelta(hours=1), host_site=sites)
    assert f.select("kind", "subject").rows() == [("site_silent", "site:a"), ("site_silent", "site:b")]
    assert json.loads(f["evidence"][0])["basis"] == "wall clock"


def test_most_of_a_site_silent_together_is_one_site_finding():
    sites = pl.DataFrame({"host": [f"n{h}" for h in range(6)], "site_id": ["a"] * 4 + ["b"] * 2})
    stop = {g: 300 for g in INV["gpu_uuid"] if g.split("-")[1] in ("0", "1", "2")}  # 3 of site a's 4 hosts
    stop.update({"GPU-4-1": 300, "GPU-5-0": 300, "GPU-5-1": 300})  # site b: too small to collapse
    f = absence.absence_findings(absence.last_seen(samples(stop), INV), now=END, host_site=sites)
    got = sorted((r["kind"], r["subject"]) for r in f.to_dicts())
    assert got == [("gpu_absent", "gpu:GPU-4-1"), ("host_down", "host:n5"), ("site_silent", "site:a")]
    assert json.loads(f.filter(pl.col("kind") == "site_silent")["evidence"][0])["down"] == ["n0", "n1", "n2"]


def test_an_outage_longer_than_the_window_is_carried_and_keeps_its_start():
    first = absence.absence_findings(absence.last_seen(samples({"GPU-3-0": 100, "GPU-3-1": 100, "GPU-0-1": 100}), INV), now=END)
    # an hour later the sweep's window holds no sample of n3 or GPU-0-1 at all
    later = END + dt.timedelta(hours=1)
    window = samples({}).with_columns(pl.col("ts") + dt.timedelta(hours=1)).filter(~pl.col("gpu_uuid").is_in(["GPU-3-0", "GPU-3-1", "GPU-0-1"]))
    seen = absence.last_seen(window, INV)
    carried = absence.carried(first, INV).filter(~pl.col("gpu_uuid").is_in(seen["gpu_uuid"].to_list()))
    again = absence.absence_findings(pl.concat([seen.select(carried.columns), carried]), now=later)
    key = ["kind", "subject", "window_start"]
    assert again.select(key).sort(key).equals(first.select(key).sort(key))  # the same findings, updated
    assert again["window_end"].unique().to_list() == [later]
    # GPU-0-1 reports again: its finding is no longer renewed
    back = pl.concat([seen, absence.last_seen(samples({}).filter(pl.col("gpu_uuid") == "GPU-0-1")
                                              .with_columns(pl.col("ts") + dt.timedelta(hours=1)), INV)])
    carried = absence.carried(first, INV).filter(~pl.col("gpu_uuid").is_in(back["gpu_uuid"].to_list()))
    again = absence.absence_findings(pl.concat([back.select(carried.columns), carried]), now=later)
    assert again["subject"].to_list() == ["host:n3"]
