"""fleetscope.services.queries on SQLite and PostgreSQL: right numbers on the showcase world, typed empty frames on
an empty database, and no full scan of a telemetry table (the dashboard's read budget, DESIGN.md)."""

from __future__ import annotations

import datetime as dt
import math
import re

import polars as pl
import pytest
from sqlalchemy import text

from analyzers.carbon import load_grid_intensity
from fleetscope.core import frames as F
from fleetscope.services.alerting import reads as alert_reads
from fleetscope.services import audit as audit_svc
from fleetscope.services import energy_rollup
from fleetscope.services import energy_reads as energy_reads
from fleetscope.services import fabric as fabric_svc
from fleetscope.services import governance as governance_svc
from fleetscope.services import health_reads
from fleetscope.services import job_reads as jobs_svc
from fleetscope.services import reliability as reliability_svc
from fleetscope.services import telemetry
from fleetscope.sim.fleet import gpu_fleet
from fleetscope.sim.showcase import (
    STRAGGLER_JOB,
    STRAGGLER_RANK,
    SWEEP_A_S,
    SWEEP_B_S,
    SWEEP_C_S,
    SWEEP_MODEL,
    SWEEP_WORLD_SIZES,
    sweep_step_s,
)
from fleetscope.store import Store, _epoch_us
from tests.dashboard.conftest import SEED_DURATION_S, SEED_START, SPEC

END = SEED_START + dt.timedelta(seconds=SEED_DURATION_S)
HOUR_AGO = END - dt.timedelta(hours=1)


@pytest.fixture(scope="module")
def fleet() -> pl.DataFrame:
    """The GPU samples the showcase wrote, to compute expected values independently of SQL."""
    return gpu_fleet(SPEC, SEED_START, SEED_DURATION_S).gpu_sample


def test_data_end_is_the_newest_row(seeded_store: Store) -> None:
    latest = telemetry.data_end(seeded_store)
    assert SEED_START < latest <= END
    assert telemetry.data_start(seeded_store) == SEED_START
    assert telemetry.sample_interval_s(seeded_store, latest) == SPEC.interval_s


def test_data_end_is_not_pulled_ahead_by_a_series_stamped_for_the_hour_ahead(seeded_store: Store) -> None:
    # A grid intensity for the next hour (as the simulator and grid APIs stamp them) must not move the
    # window past the telemetry: every live panel would look at an empty window.
    latest = telemetry.data_end(seeded_store)
    hour_ahead = latest.replace(minute=0, second=0, microsecond=0) + dt.timedelta(hours=1)
    seeded_store.write(F.Batch(metric_sample=pl.DataFrame({"ts": [hour_ahead], "series": ['grid_intensity_g_per_kwh{site="site-a"}'], "value": [300.0]})))
    try:
        assert telemetry.data_end(seeded_store) == latest
    finally:
        with seeded_store.engine.begin() as conn:
            conn.execute(text("DELETE FROM metric_sample WHERE ts = :t"), {"t": hour_ahead if seeded_store.dialect == "postgresql" else _epoch_us(hour_ahead)})


def test_data_end_falls_back_to_metric_series(empty_store: Store) -> None:
    t = END.replace(microsecond=0)
    empty_store.write(F.Batch(metric_sample=pl.DataFrame({"ts": [t], "series": ["facility_power_w"], "value": [1.0]})))
    try:
        assert telemetry.data_end(empty_store) == t
    finally:
        with empty_store.engine.begin() as conn:
            conn.execute(text("DELETE FROM metric_sample"))
            conn.execute(text("DELETE FROM series"))


def test_fleet_size_and_sites(seeded_store: Store) -> None:
    assert telemetry.fleet_size(seeded_store).row(0, named=True) == {"sites": 2, "hosts": 8, "gpus": 64}
    assert telemetry.fleet_size(seeded_store, site="site-b")["gpus"][0] == 32
    assert telemetry.sites(seeded_store)["site_id"].to_list() == ["site-a", "site-b"]


def test_latest_samples_and_power_now_match_the_simulated_fleet(seeded_store: Store, fleet: pl.DataFrame) -> None:
    last = fleet.filter(pl.col("ts") == pl.col("ts").max())
    latest = telemetry.latest_fields(seeded_store, END, ["power_w", "temp_c"])
    assert latest.height == 64
    assert latest["ts"].unique().to_list() == [last["ts"][0]]
    want = last.select("gpu_uuid", "power_w", "temp_c").sort("gpu_uuid")
    assert latest.select("gpu_uuid", "power_w", "temp_c").sort("gpu_uuid").with_columns(pl.col("temp_c").cast(want["temp_c"].dtype)).equals(want)
    power = telemetry.power_now(seeded_store, END).row(0, named=True)
    assert power["gpus_reporting"] == 64
    assert power["power_w"] == pytest.approx(last["power_w"].sum())
    assert telemetry.power_now(seeded_store, END, site="site-a")["gpus_reporting"][0] == 32


def test_one_gpus_history_is_its_samples_and_the_inventory_lists_the_gpus(seeded_store: Store, fleet: pl.DataFrame) -> None:
    gpus = telemetry.inventory_gpus(seeded_store)
    assert gpus.height == 64 and gpus.select("host", "gpu_index").rows() == sorted(gpus.select("host", "gpu_index").rows())
    assert telemetry.inventory_gpus(seeded_store, site="site-b")["host"].str.starts_with("site-b").all()
    assert telemetry.inventory_gpus(seeded_store, limit=5).height == 5
    gpu = gpus["gpu_uuid"][9]
    # the Health page's read over an hour: every raw sample of the GPU, as the simulator made it
    got = telemetry.gpu_field_series(seeded_store, gpu, ("power_w", "temp_c"), HOUR_AGO, END)
    mine = fleet.filter(pl.col("gpu_uuid") == gpu).sort("ts")
    assert got["tier"].unique().to_list() == ["raw"] and got.height == 2 * mine.height
    for field in ("power_w", "temp_c"):
        one = got.filter(pl.col("field") == field)
        assert one["ts"].to_list() == mine["ts"].to_list()
        assert one["mean"].to_list() == pytest.approx(mine[field].cast(pl.Float64).to_list(), rel=1e-6)  # float4 where packed


def test_gpu_states_are_disjoint_and_cover_the_fleet(seeded_store: Store, fleet: pl.DataFrame) -> None:
    counts = health_reads.gpu_state_counts(seeded_store, END).row(0, named=True)
    assert counts["gpus"] == counts["reporting"] == 64
    # Three GPUs had an XID, an SDC or a double-bit ECC event (fleetscope.sim.showcase._health).
    assert counts["unhealthy"] == 3
    assert counts["busy"] + counts["idle"] + counts["unhealthy"] + counts["silent"] == 64
    recent = fleet.filter(pl.col("ts") >= END - dt.timedelta(seconds=300)).group_by("gpu_uuid").agg(pl.col("util_ratio").mean())
    bad = set(health_reads.unhealthy_gpus(seeded_store, HOUR_AGO, END)["gpu_uuid"])
    assert counts["busy"] == recent.filter((pl.col("util_ratio") >= 0.1) & ~pl.col("gpu_uuid").is_in(list(bad))).height
    # An hour after the data ends, every GPU is silent.
    later = health_reads.gpu_state_counts(seeded_store, END + dt.timedelta(hours=2)).row(0, named=True)
    assert later["silent"] == 64 and later["reporting"] == 0


def test_gpu_states_count_an_unhealthy_gpu_that_went_silent_once(seeded_store: Store) -> None:
    # Ten minutes after the data ends no GPU reports; the three GPUs with serious events in the last hour are
    # unhealthy, and not silent as well.
    counts = health_reads.gpu_state_counts(seeded_store, END + dt.timedelta(minutes=10)).row(0, named=True)
    assert counts == {"gpus": 64, "reporting": 0, "busy": 0, "idle": 0, "unhealthy": 3, "silent": 61}
    site_b = health_reads.gpu_state_counts(seeded_store, END, site="site-b").row(0, named=True)
    assert site_b["gpus"] == site_b["reporting"] == 32 and site_b["unhealthy"] == 0
    assert site_b["busy"] + site_b["idle"] == 32


def test_health_grid_puts_unhealthy_hosts_first(seeded_store: Store) -> None:
    grid = health_reads.health_grid(seeded_store, END)
    assert grid.height == 64
    unhealthy = grid.filter(pl.col("status") == "unhealthy")
    assert unhealthy.height == 3 and set(unhealthy["host"]) == {"site-a-node-001", "site-a-node-002"}
    assert grid["status"][0] == "unhealthy"  # worst hosts first
    two = health_reads.health_grid(seeded_store, END, max_hosts=2)
    assert set(two["host"]) == {"site-a-node-001", "site-a-node-002"}


@pytest.mark.parametrize("when", [END, END + dt.timedelta(minutes=10)], ids=["reporting", "silent"])
@pytest.mark.parametrize("site", [None, "site-a"])
def test_the_live_panel_in_one_read_is_the_panels_read_apart(seeded_store: Store, when: dt.datetime, site: str | None) -> None:
    """``live_state`` gives the Overview's live panel from one read of the latest samples: its parts must equal
    the reads the API and CLI make of each, while GPUs report and after they went silent."""
    state = health_reads.live_state(seeded_store, when, site=site)
    assert state["size"].equals(telemetry.fleet_size(seeded_store, site=site))
    assert state["counts"].equals(health_reads.gpu_state_counts(seeded_store, when, site=site))
    power, alone = state["power"].row(0, named=True), telemetry.power_now(seeded_store, when, site=site).row(0, named=True)
    assert power["as_of"] == alone["as_of"] and power["gpus_reporting"] == alone["gpus_reporting"]
    assert (power["power_w"] is None) == (alone["power_w"] is None) and (alone["power_w"] is None or power["power_w"] == pytest.approx(alone["power_w"]))
    assert state["grid"].equals(health_reads.health_grid(seeded_store, when, site=site))
    if when == END:
        assert power["gpus_reporting"] == (64 if site is None else 32) and state["grid"].height == power["gpus_reporting"]
    else:
        assert power == {"as_of": None, "gpus_reporting": 0, "power_w": None}


def test_fleet_series_probes_the_range(seeded_store: Store, fleet: pl.DataFrame) -> None:
    series = telemetry.fleet_series(seeded_store, HOUR_AGO, END, points=6)
    # The range starts before the data: points spread over the part that has data.
    assert series.height == 6
    assert series["gpus_reporting"].to_list() == [64] * 6
    assert series["ts"].is_sorted() and series["ts"][-1] == END
    last = fleet.filter(pl.col("ts") >= END - dt.timedelta(seconds=15)).group_by("gpu_uuid").agg(pl.col("power_w").mean())
    assert series["power_w"][-1] == pytest.approx(last["power_w"].sum())


def test_gpu_energy_is_the_counter_difference(seeded_store: Store, fleet: pl.DataFrame) -> None:
    per_gpu = fleet.group_by("gpu_uuid").agg((pl.col("energy_j").max() - pl.col("energy_j").min()).alias("e"))
    energy = energy_reads.gpu_energy(seeded_store, HOUR_AGO, END)
    assert energy["site_id"].to_list() == ["site-a", "site-b"]
    assert energy["gpus"].sum() == 64
    assert energy["energy_j"].sum() == pytest.approx(per_gpu["e"].sum())


def test_energy_by_site_hour_reads_the_roll_up_with_location_based_carbon(seeded_store: Store, fleet: pl.DataFrame) -> None:
    # The worker's roll-up of the showcase's 30 minutes: per GPU, the counter's rise over the samples
    # (the last minute ends at the last sample); sites without a country get the world's annual intensity.
    per_gpu = fleet.group_by("gpu_uuid").agg((pl.col("energy_j").max() - pl.col("energy_j").min()).alias("e"))
    rolled = energy_reads.energy_by_site_hour(seeded_store, HOUR_AGO, END)
    assert rolled.select("site_id", "hour", "gpus").rows() == [("site-a", SEED_START, 32), ("site-b", SEED_START, 32)]
    assert rolled["energy_j"].sum() == pytest.approx(per_gpu["e"].sum(), rel=1e-9)
    world = load_grid_intensity().filter((pl.col("country") == "WLD") & (pl.col("region") == "")).sort("year").row(-1, named=True)
    assert rolled["g_per_kwh"].to_list() == [world["g_per_kwh"]] * 2
    assert rolled["kgco2e"].to_list() == pytest.approx((rolled["energy_j"] / 3.6e6 * world["g_per_kwh"] / 1000).to_list())
    assert energy_reads.energy_by_site_hour(seeded_store, HOUR_AGO, END, site="site-b")["site_id"].to_list() == ["site-b"]
    assert energy_rollup.energy_rollup_end(seeded_store) == END
    # An hourly intensity series, where one covers the hour, wins over the annual figure.
    seeded_store.write(F.Batch(metric_sample=pl.DataFrame({"ts": [SEED_START], "series": ['grid_intensity_g_per_kwh{site="site-a"}'], "value": [100.0]})))
    try:
        hourly = energy_reads.energy_by_site_hour(seeded_store, HOUR_AGO, END)
        assert hourly.select("site_id", "g_per_kwh", "intensity_basis").rows()[0] == ("site-a", 100.0, "hourly")
        assert hourly["kgco2e"][0] == pytest.approx(hourly["energy_j"][0] / 3.6e6 * 0.1)
    finally:
        with seeded_store.engine.begin() as conn:
            conn.execute(text("DELETE FROM metric_sample WHERE series_id IN (SELECT series_id FROM series WHERE name = 'grid_intensity_g_per_kwh')"))


def test_counter_energy_by_hour_adds_up_hour_by_hour(seeded_store: Store, fleet: pl.DataFrame) -> None:
    # The counters' rise per GPU, read at probes after each boundary: the same total as the roll-up and
    # gpu_energy over the showcase's half hour, and quarter-hours read one by one add up to it exactly.
    per_gpu = fleet.group_by("gpu_uuid").agg((pl.col("energy_j").max() - pl.col("energy_j").min()).alias("e"))
    whole = energy_reads.counter_energy_by_site_hour(seeded_store, HOUR_AGO, END)
    assert whole.select("site_id", "hour", "gpus").rows() == [("site-a", SEED_START, 32), ("site-b", SEED_START, 32)]
    assert whole["energy_j"].sum() == pytest.approx(per_gpu["e"].sum(), rel=1e-12)
    assert whole["kgco2e"].to_list() == pytest.approx(energy_reads.energy_by_site_hour(seeded_store, HOUR_AGO, END)["kgco2e"].to_list(), rel=1e-9)
    quarter = dt.timedelta(minutes=15)
    parts = [energy_reads.counter_energy_by_site_hour(seeded_store, SEED_START + i * quarter, SEED_START + (i + 1) * quarter) for i in range(2)]
    assert sum(p["energy_j"].sum() for p in parts) == pytest.approx(whole["energy_j"].sum(), rel=1e-12)
    assert energy_reads.counter_energy_by_site_hour(seeded_store, SEED_START + dt.timedelta(minutes=10), END, site="site-b")["site_id"].to_list() == ["site-b"]
    assert energy_reads.counter_energy_by_site_hour(seeded_store, END, END + dt.timedelta(hours=1)).is_empty()


def test_counter_energy_splits_at_the_hour(empty_sqlite_url: str) -> None:
    # 40 minutes across 13:00: the first sample at or after 13:00 closes hour 12 and opens hour 13.
    store = Store.open(empty_sqlite_url)
    start = dt.datetime(2026, 3, 1, 12, 40, tzinfo=dt.UTC)
    batch = gpu_fleet(SPEC, start, 2400)
    store.write(batch)
    s = batch.gpu_sample
    at13 = s.filter(pl.col("ts") == dt.datetime(2026, 3, 1, 13, tzinfo=dt.UTC)).select("gpu_uuid", pl.col("energy_j").alias("e13"))
    rise = s.group_by("gpu_uuid").agg(pl.col("energy_j").min().alias("e0"), pl.col("energy_j").max().alias("e1")).join(at13, on="gpu_uuid")
    got = energy_reads.counter_energy_by_site_hour(store, start, start + dt.timedelta(hours=1))
    assert got.group_by("hour").agg(pl.col("energy_j").sum()).sort("hour").rows() == [
        (dt.datetime(2026, 3, 1, 12, tzinfo=dt.UTC), pytest.approx((rise["e13"] - rise["e0"]).sum(), rel=1e-12)),
        (dt.datetime(2026, 3, 1, 13, tzinfo=dt.UTC), pytest.approx((rise["e1"] - rise["e13"]).sum(), rel=1e-12)),
    ]
    store.engine.dispose()


def test_health_events_and_findings(seeded_store: Store) -> None:
    over_time = health_reads.health_events_over_time(seeded_store, HOUR_AGO, END, bucket_s=600)
    assert over_time["events"].sum() == 6
    assert all(t.minute % 10 == 0 and t.second == 0 for t in over_time["ts"])
    by_node = health_reads.health_events_by_node(seeded_store, HOUR_AGO, END)
    assert by_node.row(0, named=True)["kind"] == "xid" and by_node["events"][0] == 2
    assert health_reads.health_events_recent(seeded_store, HOUR_AGO, END, kinds=("sdc",)).height == 1
    assert health_reads.health_events_recent(seeded_store, HOUR_AGO, END, site="site-b").height == 0
    kinds = health_reads.findings_by_kind(seeded_store, HOUR_AGO, END)
    assert set(kinds["kind"]) >= {"straggler", "sdc_suspect", "gpu_send_for_repair", "node_drain_node"}
    health = health_reads.findings(seeded_store, HOUR_AGO, END, analyzer="health")
    assert sorted(health["kind"]) == ["gpu_send_for_repair", "node_drain_node"]
    straggler = health_reads.findings(seeded_store, HOUR_AGO, END, kind_like="%straggler%")
    assert straggler["subject"].to_list() == [f"job:{STRAGGLER_JOB}/rank:{STRAGGLER_RANK}"]


def test_jobs_steps_and_stragglers(seeded_store: Store) -> None:
    jobs = jobs_svc.jobs(seeded_store, HOUR_AGO, END)
    assert set(jobs["job_id"]) == {"job-llm-a", "job-llm-b", "job-llm-c"} | {f"job-sweep-n{n}" for n in SWEEP_WORLD_SIZES}
    # goodput_ratio is the goodput analyzer's stored result (job_analysis), read in SQL on both databases.
    goodput = dict(jobs.select("job_id", "goodput_ratio").rows())
    assert goodput[STRAGGLER_JOB] == pytest.approx(jobs_svc.job_analyses(seeded_store, STRAGGLER_JOB)["goodput"]["goodput_ratio"])
    assert goodput["job-sweep-n4"] == pytest.approx(1.0)
    assert jobs_svc.running_jobs(seeded_store, END)["job_id"].to_list() == [STRAGGLER_JOB]
    steps = jobs_svc.job_step_summary(seeded_store, STRAGGLER_JOB)
    assert steps.height == 40 and steps["ranks"].unique().to_list() == [16]
    # C³: compute + exposed communication + idle add up to the step time.
    parts = steps["compute_mean_s"] + steps["comm_exposed_mean_s"] + steps["idle_mean_s"]
    assert (parts - steps["step_mean_s"]).abs().max() < 1e-6  # step bounds are stored to the µs
    ranks = jobs_svc.job_rank_summary(seeded_store, STRAGGLER_JOB)
    assert ranks["rank"][0] == STRAGGLER_RANK and ranks["slowdown_ratio"][0] == pytest.approx(1.8, rel=0.05)
    assert ranks["host"].null_count() == 0
    cells = jobs_svc.job_rank_step_times(seeded_store, STRAGGLER_JOB, last_steps=10, max_ranks=4)
    assert sorted(cells["rank"].unique()) == [0, 4, 8, 12] and cells["step"].n_unique() == 10
    worst = cells.group_by("rank").agg(pl.col("compute_s").mean()).sort("compute_s", descending=True)["rank"][0]
    assert worst == 4  # the group holding rank 5
    totals = jobs_svc.job_totals(seeded_store, STRAGGLER_JOB).row(0, named=True)
    assert totals["steps"] == 40 and totals["ranks"] == 16 and totals["comm_intensity_bytes_per_flop"] > 0
    scaling = jobs_svc.scaling(seeded_store, "llama-7b")
    assert scaling["world_size"].to_list() == [8, 16, 32] and scaling["efficiency_ratio"][0] == pytest.approx(1.0)


def test_stored_analyses_and_the_c3_breakdown(seeded_store: Store) -> None:
    analyses = jobs_svc.job_analyses(seeded_store, STRAGGLER_JOB)
    assert {"c3", "goodput", "stragglers", "checkpoint"} <= set(analyses)
    assert analyses["goodput"]["computed_at"] == END and analyses["goodput"]["total_s"] > 0
    c3 = jobs_svc.job_c3_steps(seeded_store, STRAGGLER_JOB)
    assert c3.height == 40 and c3["ranks"].unique().to_list() == [16]
    # C1 + C2 + C3 = step time (analyzers.c3.c3_breakdown), and the job's C1 share matches its summary.
    assert ((c3["c1_compute_s"] + c3["c2_comm_s"] + c3["c3_coord_s"]) - c3["step_mean_s"]).abs().max() < 1e-9
    assert c3["c1_compute_s"].sum() / c3["step_mean_s"].sum() == pytest.approx(analyses["c3"]["c1_ratio"], rel=1e-6)
    assert jobs_svc.job_analyses(seeded_store, "nope") == {}


def test_the_fleet_law_fit_recovers_the_sweep(seeded_store: Store) -> None:
    fit = jobs_svc.scaling_fit(seeded_store, SWEEP_MODEL)
    assert fit["runs"]["world_size"].to_list() == list(SWEEP_WORLD_SIZES)
    assert fit["runs"]["step_time_mean_s"].to_list() == pytest.approx([sweep_step_s(n) for n in SWEEP_WORLD_SIZES], abs=1e-6)
    f = fit["fit"]
    assert (f["a_s"], f["b_s"], f["c_s"]) == pytest.approx((SWEEP_A_S, SWEEP_B_S, SWEEP_C_S), rel=1e-4)
    assert f["n_opt"] == pytest.approx(math.sqrt(SWEEP_A_S / (2 * SWEEP_B_S)), rel=1e-4) and f["r2"] == pytest.approx(1.0)
    curve = fit["curve"]
    assert curve["world_size"].min() == pytest.approx(2.0) and curve["world_size"].max() == pytest.approx(128.0)
    best = curve.sort("step_time_s").row(0, named=True)
    assert 28 < best["world_size"] < 36  # the curve's lowest point sits at N*
    assert curve.filter(pl.col("world_size") == 4.0)["efficiency_ratio"].to_list() == pytest.approx([1.0])
    none = jobs_svc.scaling_fit(seeded_store, "nope")
    assert none["fit"] is None and none["why"] == "0 distinct world sizes of nope; the fit needs three" and none["curve"].is_empty()


def test_network(seeded_store: Store) -> None:
    runs = fabric_svc.nccl_test_runs(seeded_store, HOUR_AGO, END)
    assert runs["run_id"].to_list() == ["nccl-tests-1", "nccl-tests-0"]
    assert runs["busbw_max_gbps"][0] > runs["busbw_max_gbps"][1]
    sizes = fabric_svc.nccl_test_sizes(seeded_store, ("nccl-tests-1",))
    assert sizes.height == 20 and sizes["size_bytes"].is_sorted()
    coll = fabric_svc.collective_busbw(seeded_store, HOUR_AGO, END)
    assert coll.select("op", "bytes").rows() == [("all_gather", 2**24), ("all_reduce", 2**20), ("all_reduce", 2**27), ("all_reduce", 2**30)]
    assert coll["calls"].to_list() == [640] * 4
    assert fabric_svc.collective_busbw(seeded_store, HOUR_AGO, END, job_id="job-llm-b").is_empty()


def test_reliability(seeded_store: Store) -> None:
    d = reliability_svc.disruptions(seeded_store, HOUR_AGO, END)
    assert sorted(d["cause"]) == ["nccl_timeout", "preempted", "restart", "xid_79"]
    summary = reliability_svc.reliability_summary(seeded_store, HOUR_AGO, END).row(0, named=True)
    assert (summary["failures"], summary["preemptions"], summary["restarts"]) == (2, 1, 1)
    assert summary["mtbf_s"] == pytest.approx(1800.0)
    ckpt = reliability_svc.checkpoint_intervals(seeded_store, HOUR_AGO, END)
    assert ckpt["job_id"].to_list() == ["job-llm-a", "job-llm-b", "job-llm-c"]
    assert ckpt["saves"].to_list() == [4, 2, 2] and ckpt["save_mean_s"].to_list() == pytest.approx([4.0] * 3)


def test_table_helpers(seeded_store: Store) -> None:
    rows = dict(telemetry.table_rows(seeded_store).select("table", "rows").rows())
    assert rows["gpu"] == 64 and rows["health_event"] == 6 and rows["nccl_test"] == 40
    assert {"finding", "alert_state", "aiact_export", "gpu_energy_minute"} <= set(telemetry.existing_tables(seeded_store))


# --- empty database ---------------------------------------------------------------------------

CALLS = {
    "sites": lambda s: telemetry.sites(s),
    "fleet_size": lambda s: telemetry.fleet_size(s),
    "inventory_gpus": lambda s: telemetry.inventory_gpus(s),
    "gpu_field_series": lambda s: telemetry.gpu_field_series(s, "GPU-nope", ("power_w", "temp_c"), HOUR_AGO, END),
    "latest_fields": lambda s: telemetry.latest_fields(s, END, ["power_w", "util_ratio"]),
    "unhealthy_gpus": lambda s: health_reads.unhealthy_gpus(s, HOUR_AGO, END),
    "health_grid": lambda s: health_reads.health_grid(s, END),
    "fleet_series": lambda s: telemetry.fleet_series(s, HOUR_AGO, END),
    "gpu_energy": lambda s: energy_reads.gpu_energy(s, HOUR_AGO, END),
    "metric_series": lambda s: telemetry.metric_series(s, "%pue%", HOUR_AGO, END),
    "site_carbon": lambda s: energy_reads.site_carbon(s, HOUR_AGO, END),
    "health_events_over_time": lambda s: health_reads.health_events_over_time(s, HOUR_AGO, END),
    "health_events_by_node": lambda s: health_reads.health_events_by_node(s, HOUR_AGO, END),
    "health_events_recent": lambda s: health_reads.health_events_recent(s, HOUR_AGO, END),
    "findings_by_kind": lambda s: health_reads.findings_by_kind(s, HOUR_AGO, END),
    "findings": lambda s: health_reads.findings(s, HOUR_AGO, END),
    "jobs": lambda s: jobs_svc.jobs(s, HOUR_AGO, END),
    "running_jobs": lambda s: jobs_svc.running_jobs(s, END),
    "job_step_summary": lambda s: jobs_svc.job_step_summary(s, "nope"),
    "job_rank_step_times": lambda s: jobs_svc.job_rank_step_times(s, "nope"),
    "job_rank_summary": lambda s: jobs_svc.job_rank_summary(s, "nope"),
    "scaling": lambda s: jobs_svc.scaling(s, "nope"),
    "nccl_test_runs": lambda s: fabric_svc.nccl_test_runs(s, HOUR_AGO, END),
    "nccl_test_sizes": lambda s: fabric_svc.nccl_test_sizes(s, ("nope",)),
    "collective_busbw": lambda s: fabric_svc.collective_busbw(s, HOUR_AGO, END),
    "disruptions": lambda s: reliability_svc.disruptions(s, HOUR_AGO, END),
    "checkpoint_intervals": lambda s: reliability_svc.checkpoint_intervals(s, HOUR_AGO, END),
    "job_c3_steps": lambda s: jobs_svc.job_c3_steps(s, "nope"),
    "energy_by_site_hour": lambda s: energy_reads.energy_by_site_hour(s, HOUR_AGO, END),
    "counter_energy_by_site_hour": lambda s: energy_reads.counter_energy_by_site_hour(s, HOUR_AGO, END),
    "alerts": lambda s: alert_reads.alerts(s),
    "silences": lambda s: alert_reads.silences(s),
    "notifications": lambda s: alert_reads.notifications(s),
    "models": lambda s: governance_svc.models(s),
    "audit_runs": lambda s: audit_svc.audit_runs(s),
    "audit_exports": lambda s: audit_svc.audit_exports(s),
    "rule_results": lambda s: audit_svc.rule_results(s, "nope"),
    "fairness_groups": lambda s: governance_svc.fairness_groups(s),
}


def test_alerting_reads(seeded_store: Store) -> None:
    alerts = alert_reads.alerts(seeded_store)
    firing = alerts.filter(pl.col("state") == "firing")
    assert sorted(firing["alertname"]) == ["GpuFellOffBus", "GpuNeedsRepairOrDrain", "GpuNeedsRepairOrDrain", "SdcSuspect"]
    # the jobs the simulator made fail and preempt: their goodput series is under 0.8, not yet for 15 minutes
    pending = alerts.filter(pl.col("state") == "pending")
    assert sorted(pending["alertname"]) == ["JobGoodputLow"] * 2
    assert sorted(pending["labels"]) == ['job_id="job-llm-b", team="training"', 'job_id="job-llm-c", team="training"']
    assert alerts["silenced_by"].null_count() == alerts.height
    # the dead GPU's XID alert mutes the sweep's repair advice for it and its node: one fault, one page
    muted = alerts.filter(pl.col("inhibited"))
    assert sorted(muted["alertname"]) == ["GpuNeedsRepairOrDrain", "GpuNeedsRepairOrDrain"]
    dead = alert_reads.notifications(seeded_store, status="dead")
    assert dead.height == 1 and set(dead["last_error"]) == {"no receiver named 'default'"}
    assert alert_reads.notification_counts(seeded_store) == {"pending": 0, "delivered": 0, "dead": 1, "disabled": 0}
    assert alert_reads.silences(seeded_store).is_empty()


def test_governance_reads(seeded_store: Store) -> None:
    assert governance_svc.models(seeded_store)["model_name"].to_list() == ["gpt-1.3b", "llama-7b", "loan-screen"]
    runs = audit_svc.audit_runs(seeded_store)
    run = runs.row(0, named=True)
    assert runs.height == 1 and run["scope"] == "registry" and run["formats"] == "json, html, pdf" and run["exports"] == 1
    results = audit_svc.rule_results(seeded_store, run["audit_id"])
    assert results.height == run["pass"] + run["fail"] + run["missing_evidence"] + run["not_applicable"]
    assert results.filter(pl.col("status") == "fail")["model"].to_list() == ["loan-screen:1"]
    exports = audit_svc.audit_exports(seeded_store)
    assert exports["audit_id"].to_list() == [run["audit_id"]] and exports["size_bytes"][0] > 0
    fair = governance_svc.fairness_groups(seeded_store)
    assert set(fair["model"]) == {"loan-screen:1"} and set(fair["feature"]) == {"sex", "age_band", "sex&age_band"}  # and intersectional
    fnr = fair.filter((pl.col("feature") == "sex") & (pl.col("metric") == "fnr")).sort("group")
    # The simulated classifier misses more women's positives (fleetscope.sim.predictions): F's FNR is higher.
    assert fnr["group"].to_list() == ["F", "M"] and fnr["value"][0] > fnr["value"][1]
    assert ((fnr["ci_low"] <= fnr["value"]) & (fnr["value"] <= fnr["ci_high"])).all()
    lineage = governance_svc.registered_model_lineage(seeded_store, "llama-7b", "1")
    assert "dataset:s3://fleetscope-raw:forum-dump-2023" in {u["dataset"] for u in lineage["upstream"]}
    assert governance_svc.registered_model_lineage(seeded_store, "nope", "1") is None


def test_an_empty_database_gives_typed_empty_frames(empty_store: Store) -> None:
    assert telemetry.data_end(empty_store) is None
    assert telemetry.sample_interval_s(empty_store, END) == telemetry.DEFAULT_SAMPLE_INTERVAL_S
    for name, call in CALLS.items():
        df = call(empty_store)
        assert isinstance(df, pl.DataFrame), name
        if name != "fleet_size":
            assert df.is_empty(), name
        assert pl.Null not in df.dtypes, f"{name}: {df.schema}"
    assert telemetry.fleet_size(empty_store).row(0) == (0, 0, 0)
    counts = health_reads.gpu_state_counts(empty_store, END).row(0, named=True)
    assert set(counts.values()) == {0}
    assert telemetry.power_now(empty_store, END)["power_w"][0] is None
    assert reliability_svc.reliability_summary(empty_store, HOUR_AGO, END)["mtbf_s"][0] is None
    assert jobs_svc.job_totals(empty_store, "nope")["steps"][0] == 0
    assert energy_rollup.energy_rollup_end(empty_store) is None and jobs_svc.job_analyses(empty_store, "nope") == {}
    assert jobs_svc.job_goodput(empty_store, "nope") is None
    assert jobs_svc.scaling_fit(empty_store, "nope")["fit"] is None
    temporal = jobs_svc.temporal(empty_store, "nope")
    assert temporal["ranks"] == [] and temporal["reason"] == jobs_svc.TEMPORAL_NO_DATA


# --- read budget ----------------------------------------------------------------------------------

BIG = ("gpu_sample", "metric_sample", "collective", "step", "step_breakdown", "gpu_energy_minute")
# "FROM metric_sample m", "JOIN step AS s": SQLite's plan names the alias (SCAN m), not the table
_ALIAS = re.compile(r"\b(?:FROM|JOIN)\s+\"?(\w+)\"?\s+(?:AS\s+)?\"?(\w+)\"?", re.IGNORECASE)
_NOT_ALIAS = {"where", "join", "left", "right", "inner", "outer", "cross", "natural", "full", "on", "using", "group", "order",
              "limit", "union", "except", "intersect", "window", "as", "indexed", "not"}


def scanned_tables(sql: str, plan_line: str) -> set[str]:
    """The tables a plan line's SCAN reads: the name it prints, or every table that name aliases in ``sql``
    (an alias reused for two tables in two scopes counts as both, so a scan is never missed)."""
    if not plan_line.startswith("SCAN "):
        return set()
    name = plan_line.split()[1]
    aliased = {t for t, a in _ALIAS.findall(sql) if a.lower() not in _NOT_ALIAS and a == name}
    return aliased or {name}


def test_no_query_scans_a_whole_telemetry_table(seeded_sqlite_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every statement the queries issue reaches the big tables through an index (SQLite's plan says
    SEARCH, never a SCAN of the table or of a whole index): the cost follows the window, not the size of the store."""
    store = Store.open(seeded_sqlite_url)
    seen: list[tuple[str, list]] = []
    real = store.query

    def spy(sql, params=(), schema_=None, small=False):  # type: ignore[no-untyped-def]
        seen.append((sql, list(params)))
        return real(sql, params, schema_, small)

    monkeypatch.setattr(store, "query", spy)
    for call in CALLS.values():
        call(store)
    jobs_svc.job_totals(store, STRAGGLER_JOB)
    jobs_svc.job_step_summary(store, STRAGGLER_JOB)
    jobs_svc.job_rank_summary(store, STRAGGLER_JOB)
    jobs_svc.job_rank_step_times(store, STRAGGLER_JOB)
    jobs_svc.job_c3_steps(store, STRAGGLER_JOB)
    jobs_svc.scaling(store, SWEEP_MODEL)
    energy_rollup.energy_rollup_end(store)
    energy_reads.counter_energy_by_site_hour(store, SEED_START + dt.timedelta(minutes=10), END)
    health_reads.gpu_state_counts(store, END)
    telemetry.data_end(store)
    telemetry.table_rows(store)
    assert len(seen) > 30
    with store.engine.connect() as conn:
        cur = conn.connection.driver_connection.cursor()
        for sql, params in seen:
            args = [_epoch_us(p) if isinstance(p, dt.datetime) else p for p in params]
            plan = [row[3] for row in cur.execute("EXPLAIN QUERY PLAN " + sql, args).fetchall()]
            for line in plan:
                # A SCAN, even of a covering index, reads the whole table: only SEARCH is bounded.
                assert not scanned_tables(sql, line) & set(BIG), f"{line}\n{sql}"
    store.engine.dispose()


def test_a_scan_is_traced_through_its_alias() -> None:
    assert scanned_tables("SELECT AVG(m.value) FROM metric_sample m JOIN series s ON s.series_id = m.series_id", "SCAN m") == {"metric_sample"}
    assert scanned_tables("SELECT 1 FROM job AS j JOIN step s ON s.job_id = j.job_id", "SCAN s USING INDEX ix_step_job_id_start") == {"step"}
    # a derived table's alias is no table: its scan reads the subquery's bounded result
    assert scanned_tables("SELECT gpu_uuid FROM (SELECT gpu_uuid FROM gpu_sample WHERE ts >= ?) x", "SCAN x") == {"x"}
    assert scanned_tables("SELECT 1 FROM gpu g LEFT JOIN host h ON h.host = g.host", "SEARCH h USING INDEX sqlite_autoindex_host_1 (host=?)") == set()


def test_a_long_jobs_rank_views_read_its_last_steps_by_time(store: Store, monkeypatch) -> None:
    """The Stragglers page's rank views of a job with a long history read the tail from when the window's first
    step began (by the (job_id, start) index), and equal the same figures worked out from every row: the last 50
    steps, rank 3 computing 30 % longer in them, and the window's first step starting early on one rank (its clock runs ahead)."""
    import random

    rnd = random.Random(4)
    t0 = dt.datetime(2026, 10, 1, tzinfo=dt.UTC)
    rows = []
    for step in range(400):
        for rank in range(6):
            start = t0 + dt.timedelta(seconds=10 * step + rnd.uniform(0, 0.05) - (0.3 if (rank, step) == (5, 350) else 0))
            compute = rnd.uniform(5, 6) * (1.3 if rank == 3 and step >= 350 else 1.0)
            rows.append({"job_id": "long", "rank": rank, "step": step, "start": start, "end": start + dt.timedelta(seconds=9.5),
                         "compute_s": compute, "comm_s": 2.0, "comm_overlap_s": 0.5, "idle_s": 9.5 - compute - 1.5})
    steps = pl.DataFrame(rows, schema_overrides={"start": pl.Datetime("us", "UTC"), "end": pl.Datetime("us", "UTC")})
    store.write(F.Batch(source="test", step=steps))
    tail = steps.filter(pl.col("step") > 399 - 50).with_columns(((pl.col("end") - pl.col("start")).dt.total_microseconds() / 1e6).alias("d"))
    seen: list[str] = []
    real = store.query
    monkeypatch.setattr(store, "query", lambda sql, params=(), schema_=None, small=False: seen.append(sql) or real(sql, params, schema_, small))
    ranks = jobs_svc.job_rank_summary(store, "long")
    assert ranks["rank"][0] == 3 and ranks["steps"].to_list() == [50] * 6
    want = tail.group_by("rank").agg(pl.col("compute_s").mean()).sort("rank")
    assert ranks.sort("rank")["compute_mean_s"].to_list() == pytest.approx(want["compute_s"].to_list(), rel=1e-12)
    cells = jobs_svc.job_rank_step_times(store, "long", last_steps=50, max_ranks=3)
    assert cells["rank"].unique().sort().to_list() == [0, 2, 4] and cells["step"].n_unique() == 50 and cells["ranks_in_cell"].unique().to_list() == [2]
    want = tail.with_columns((pl.col("rank") // 2 * 2).alias("rank")).group_by("rank", "step").agg(pl.col("idle_s").min()).sort("rank", "step")
    assert cells["idle_s"].to_list() == pytest.approx(want["idle_s"].to_list(), rel=1e-12)
    assert all('"start" >= ?' in q for q in seen if "step > ?" in q) and sum("step > ?" in q for q in seen) == 2


def test_last_steps_of_a_job_that_records_every_tenth_step(store: Store) -> None:
    """A job whose step numbers are sparse (every tenth step recorded) still gets its last ``max_steps`` recorded
    steps per step, as it does its dense steps (the window by number holds too few; the job is read whole)."""
    t0 = dt.datetime(2026, 10, 1, tzinfo=dt.UTC)
    rows = [{"job_id": j, "rank": r, "step": s * k, "start": t0 + dt.timedelta(seconds=10 * s), "end": t0 + dt.timedelta(seconds=10 * s + 9),
             "compute_s": 5.0 + s / 100, "comm_s": 2.0, "comm_overlap_s": 0.5, "idle_s": 1.0}
            for j, k in (("sparse", 10), ("dense", 1)) for s in range(120) for r in range(2)]
    store.write(F.Batch(source="test", step=pl.DataFrame(rows, schema_overrides={"start": pl.Datetime("us", "UTC"), "end": pl.Datetime("us", "UTC")})))
    for job, k in (("sparse", 10), ("dense", 1)):
        got = jobs_svc.job_step_summary(store, job, max_steps=30)
        assert got["step"].to_list() == [s * k for s in range(90, 120)], job
        assert got["compute_mean_s"].to_list() == pytest.approx([5.0 + s / 100 for s in range(90, 120)])
