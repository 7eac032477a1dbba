"""The per-job hour roll-up (``job_usage_hour``): a long period's busy share and energy read from it equal what
the hour tier alone gives and what the definition gives from the minute samples; a scheduler record that
arrives or changes after its hours were rolled is costed from the tier, then healed by the next tick."""

import datetime as dt
import random

import polars as pl
import pytest

from analyzers import job_usage as usage_analysis
from analyzers import scheduler as sched_analysis
from fleetscope.core import frames as F
from fleetscope.core import scheduler_frames as SCH
from fleetscope.core.spec import conform
from fleetscope.services import job_usage, pipeline, scheduled, tiers

T0 = dt.datetime(2026, 10, 1, tzinfo=dt.UTC)
DAYS = 3
END = T0 + dt.timedelta(days=DAYS)
HOSTS = [f"n{i}" for i in range(4)]
PERIOD = (T0, END + dt.timedelta(days=1))  # over RAW_MAX_RANGE, from the hour tier's first hour: its path


def _gpus() -> list[str]:
    return [f"GPU-{h}-{i}" for h in HOSTS for i in range(2)]


def _job(job_id: str, start: dt.datetime, end: dt.datetime | None, hosts: list[str]) -> tuple[dict, list[dict]]:
    job = {"cluster": "c1", "job_id": job_id, "scheduler": "slurm", "user": "u", "account": "a", "state": "RUNNING" if end is None else "COMPLETED",
           "gpus": 2 * len(hosts), "start_at": start, "end_at": end, "submit_at": start}
    return job, [{"cluster": "c1", "job_id": job_id, "host": h, "gpus": 2, "gpu_indices": "0,1"} for h in hosts]


def _write_jobs(store, specs: list[tuple[dict, list[dict]]]) -> None:
    jobs = pl.DataFrame([j for j, _ in specs], schema_overrides={"start_at": pl.Datetime("us", "UTC"), "end_at": pl.Datetime("us", "UTC"),
                                                               "submit_at": pl.Datetime("us", "UTC")})
    nodes = pl.DataFrame([n for _, ns in specs for n in ns])
    store.write_frames([(SCH.SCHED_JOB, conform(SCH.SCHED_JOB, jobs)), (SCH.SCHED_JOB_NODE, conform(SCH.SCHED_JOB_NODE, nodes))], source="sacct")


@pytest.fixture()
def fleet(store):
    """4 nodes of 2 GPUs sampled every minute for 3 days, unevenly (a GPU misses a fifth of its minutes, some
    samples have no utilisation or no power), and jobs over them: whole days, a run inside one hour, one still
    running, one sharing another's node afterwards."""
    rnd = random.Random(11)
    store.write(F.Batch(gpu=F.conform(F.GPU, pl.DataFrame([{"gpu_uuid": g, "host": g.split("-")[1], "gpu_index": int(g[-1])} for g in _gpus()]))))
    rows = []
    for g in _gpus():
        for m in range(DAYS * 1440):
            if g.endswith("n1-1") and rnd.random() < 0.2:
                continue
            rows.append({"ts": T0 + dt.timedelta(minutes=m, seconds=rnd.randrange(60)), "gpu_uuid": g,
                         "util_ratio": None if rnd.random() < 0.05 else rnd.random(), "power_w": None if rnd.random() < 0.03 else rnd.uniform(60, 700)})
    store.write(F.Batch(gpu_sample=F.conform(F.GPU_SAMPLE, pl.DataFrame(rows, schema_overrides={"ts": pl.Datetime("us", "UTC")}))))
    h = dt.timedelta(hours=1)
    _write_jobs(store, [
        _job("long", T0 + dt.timedelta(minutes=17), T0 + dt.timedelta(days=1, hours=5, minutes=3), ["n0", "n1"]),
        _job("short", T0 + 30 * h + dt.timedelta(minutes=10), T0 + 30 * h + dt.timedelta(minutes=50), ["n2"]),
        _job("running", T0 + 40 * h + dt.timedelta(minutes=41), None, ["n2", "n3"]),
        _job("after", T0 + dt.timedelta(days=1, hours=6), T0 + dt.timedelta(days=2, hours=1), ["n1"]),
    ])
    tiers.advance(store, END + dt.timedelta(hours=3), max_chunks=200)
    return store


def _alloc(store, period=PERIOD):
    jobs = job_usage.jobs_in(store, *period, job_usage.COST_COLUMNS)
    return sched_analysis.allocated_gpu_seconds(jobs, *period, now=period[1])


def _by_hand(store, job_id: str, period=PERIOD) -> dict[str, float]:
    """The definition from the raw samples: each (GPU, hour) the job held, the hour's mean util_ratio and power
    (of the samples that have them) weighted by the hour's samples, pooled over the job's GPUs and hours; energy
    is that power × the time held × its GPUs with power."""
    job = store.read("sched_job").filter(pl.col("job_id") == job_id).row(0, named=True)
    hosts = store.read("sched_job_node").filter(pl.col("job_id") == job_id)["host"].to_list()
    s = max(job["start_at"], period[0])
    e = min(job["end_at"] or period[1], period[1])
    raw = store.read("gpu_sample", start=PERIOD[0], end=PERIOD[1]).filter(pl.col("gpu_uuid").str.split("-").list.get(1).is_in(hosts))
    hours = raw.with_columns(pl.col("ts").dt.truncate("1h").alias("h")).filter(
        (pl.col("h") >= s.replace(minute=0, second=0, microsecond=0)) & (pl.col("h") < e))
    per = hours.group_by("gpu_uuid", "h").agg(pl.len().alias("n"), pl.col("util_ratio").mean().alias("u"), pl.col("power_w").mean().alias("p"))
    u = per.filter(pl.col("u").is_not_null())
    p = per.filter(pl.col("p").is_not_null())
    busy = (u["u"] * u["n"]).sum() / u["n"].sum()
    power = (p["p"] * p["n"]).sum() / p["n"].sum()
    return {"busy_ratio": busy, "energy_j": power * (e - s).total_seconds() * p["gpu_uuid"].n_unique()}


def _figures(store) -> dict[str, tuple[float, float]]:
    b = job_usage.busy(store, _alloc(store), *PERIOD)
    return {r["job_id"]: (r["busy_ratio"], r["energy_j"]) for r in b.to_dicts()}


def _reads(store, monkeypatch) -> list[tuple[str, dt.datetime | None]]:
    seen: list[tuple[str, dt.datetime | None]] = []
    read = store.read

    def spy(table, *a, **k):
        seen.append((table, k.get("start")))
        return read(table, *a, **k)

    monkeypatch.setattr(store, "read", spy)
    return seen


def test_rolled_hours_give_what_the_hour_tier_and_the_definition_give(fleet, monkeypatch):
    assert job_usage.usage_tier(fleet, *PERIOD) == "hour"
    before = _figures(fleet)
    assert set(before) == {"long", "short", "running", "after"}
    for j in before:
        want = _by_hand(fleet, j)
        assert before[j] == (pytest.approx(want["busy_ratio"], rel=1e-9), pytest.approx(want["energy_j"], rel=1e-9)), j

    now = END + dt.timedelta(hours=3)
    out = job_usage.advance(fleet, now)
    hour_wm = tiers.watermark(fleet, "hour")
    assert out["watermark"] == min(hour_wm, (now - job_usage.SETTLE).replace(minute=0, second=0, microsecond=0)).isoformat()
    rows = fleet.read("job_usage_hour")
    # long: 00:00 of day 0 to 05:00 of day 1 (30 hours); short: its one hour; after: 19 hours; running: from 16:00 of day 1 to the watermark
    n = {j: g.height for (j,), g in rows.group_by("job_id")}
    wm = job_usage.watermark(fleet)
    assert n == {"long": 30, "short": 1, "after": 19, "running": int((wm - (T0 + dt.timedelta(hours=40))) / dt.timedelta(hours=1))}
    assert rows.filter(pl.col("job_id") == "long")["gpus"].unique().to_list() == [4]

    seen = _reads(fleet, monkeypatch)
    after = _figures(fleet)
    assert after.keys() == before.keys()
    for j in before:
        assert after[j] == (pytest.approx(before[j][0], rel=1e-9), pytest.approx(before[j][1], rel=1e-9)), j
    # the hour tier is read only from the roll-up's watermark on (the running job's hours not rolled yet)
    tier_reads = [(t, s) for t, s in seen if t in ("gpu_sample_hour", "gpu_sample_minute", "gpu_sample")]
    assert tier_reads and all(t != "gpu_sample" and s >= wm for t, s in tier_reads), tier_reads

    # a second tick rolls nothing new and heals nothing
    again = job_usage.advance(fleet, now)
    assert (again["rows"], again["healed_jobs"]) == (0, 0)


def test_a_record_that_arrives_or_changes_after_its_hours_were_rolled(fleet, monkeypatch):
    now = END + dt.timedelta(hours=3)
    job_usage.advance(fleet, now)
    h = dt.timedelta(hours=1)
    # sacct reports a job days late, and the "after" job's node list gains a node
    _write_jobs(fleet, [_job("late", T0 + 50 * h, T0 + 60 * h + dt.timedelta(minutes=5), ["n0", "n3"]),
                        _job("after", T0 + dt.timedelta(days=1, hours=6), T0 + dt.timedelta(days=2, hours=1), ["n1", "n0"])])
    got = _figures(fleet)
    for j in ("late", "after", "long"):
        want = _by_hand(fleet, j)
        assert got[j] == (pytest.approx(want["busy_ratio"], rel=1e-9), pytest.approx(want["energy_j"], rel=1e-9)), j

    out = job_usage.advance(fleet, now)
    assert out["healed_jobs"] == 2
    rows = fleet.read("job_usage_hour")
    assert rows.filter(pl.col("job_id") == "late").height == 11 and rows.filter(pl.col("job_id") == "after")["gpus"].unique().to_list() == [4]
    seen = _reads(fleet, monkeypatch)
    healed = _figures(fleet)
    assert healed == {j: (pytest.approx(v[0], rel=1e-9), pytest.approx(v[1], rel=1e-9)) for j, v in got.items()}
    wm = job_usage.watermark(fleet)
    assert all(s >= wm for t, s in seen if t.startswith("gpu_sample"))

    # a job that ends sooner than first reported loses the hours it no longer holds (only the rows it still
    # holds count, so the figures are right before the heal too)
    _write_jobs(fleet, [_job("long", T0 + dt.timedelta(minutes=17), T0 + dt.timedelta(hours=3), ["n0", "n1"])])
    want = _by_hand(fleet, "long")
    assert _figures(fleet)["long"] == (pytest.approx(want["busy_ratio"], rel=1e-9), pytest.approx(want["energy_j"], rel=1e-9))


def test_hour_rows_every_hour_held_even_without_telemetry():
    t = dt.datetime(2026, 11, 1, 10, tzinfo=dt.UTC)
    spans = pl.DataFrame({"cluster": ["", "", ""], "job_id": ["inside", "dark", "run"],
                          "start_at": [t + dt.timedelta(minutes=10), t, t + dt.timedelta(hours=1, minutes=30)],
                          "end_at": [t + dt.timedelta(minutes=50), t + dt.timedelta(hours=2), None]},
                         schema_overrides={"start_at": pl.Datetime("us", "UTC"), "end_at": pl.Datetime("us", "UTC")})
    jg = pl.DataFrame({"cluster": ["", "", "", ""], "job_id": ["inside", "dark", "run", "run"], "gpu_uuid": ["A", "D", "A", "B"]})
    buckets = pl.DataFrame({"ts": [t, t + dt.timedelta(hours=1), t + dt.timedelta(hours=2), t + dt.timedelta(hours=1)],
                            "gpu_uuid": ["A", "A", "A", "B"], "util_ratio": [0.5, 0.25, 1.0, None], "power_w": [100.0, 200.0, 300.0, 400.0],
                            "_w": [60.0, 30.0, 60.0, 60.0]}, schema_overrides={"ts": pl.Datetime("us", "UTC")})
    rows = usage_analysis.hour_rows(spans, jg, buckets, t, t + dt.timedelta(hours=3))
    got = {(r["job_id"], r["bucket"].hour): (r["gpus"], r["util_weighted"], r["util_samples"], r["power_weighted"], r["power_samples"], r["power_gpus"])
           for r in rows.to_dicts()}
    assert got == {("inside", 10): (1, 30.0, 60.0, 6000.0, 60.0, 1),
                   ("dark", 10): (1, 0.0, 0.0, 0.0, 0.0, 0), ("dark", 11): (1, 0.0, 0.0, 0.0, 0.0, 0),
                   ("run", 11): (2, 7.5, 30.0, 6000.0 + 24000.0, 90.0, 2), ("run", 12): (2, 60.0, 60.0, 18000.0, 60.0, 1)}
    e = usage_analysis.busy_and_energy(rows.filter(pl.col("job_id") == "dark").group_by("job_id").agg(
        *[pl.col(c).sum() for c in usage_analysis.SUMS], pl.col("power_gpus").max()).with_columns(pl.lit(7200.0).alias("held_s")))
    assert e.select("busy_ratio", "energy_j").row(0) == (None, None)  # no telemetry: unknown, not idle


def test_the_roll_up_is_a_beat_task_a_pipeline_stage_and_pruned_with_the_hour_tier(fleet):
    from fleetscope.services import retention
    from fleetscope.settings import load as load_settings

    entry = next(r for r in scheduled.SCHEDULED if r.name == "job_usage_rollup")
    assert entry.beat.entry == "job-usage-rollup" and entry.beat.every_s == 300.0
    now = END + dt.timedelta(hours=3)
    assert job_usage.scheduled_advance(fleet, load_settings(), now_iso=now.isoformat())["rows"] > 0
    stage = next(s for s in pipeline.status(fleet, now, tasks=False)["stages"] if s["stage"] == "job_hour")
    assert stage["rolled_to"] == job_usage.watermark(fleet) and not stage["late"]
    s = load_settings()
    cut = retention.cutoffs(now, s.retention_days, s.evidence_retention_days, retention.tier_days(s))
    assert cut["job_usage_hour"] == cut["gpu_sample_hour"]
    deleted = retention.prune(fleet, T0 + dt.timedelta(days=1, hours=s.hour_tier_retention_days * 24), s.retention_days,
                              s.evidence_retention_days, retention.tier_days(s))
    assert deleted["job_usage_hour"] == 24  # the long job's first day: every hour before the cutoff
    assert fleet.read("job_usage_hour")["bucket"].min() == T0 + dt.timedelta(days=1)
