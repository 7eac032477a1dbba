"""Teams and cost through the store: the real Hábrók sacct text, a mapping set through the service (audit
logged), GPU telemetry on one job's GPU, prices from the price book; figures checked by hand."""

import datetime as dt

import polars as pl
import pytest

from fleetscope.core import frames as F
from fleetscope.core.errors import ValidationError
from fleetscope.services import serving, teams
from ingest import slurm_sacct

APRIL = (dt.datetime(2024, 4, 1, tzinfo=dt.UTC), dt.datetime(2024, 5, 1, tzinfo=dt.UTC))
JOB_START = dt.datetime(2024, 4, 5, 0, 18, 37, tzinfo=dt.UTC)  # job 7946767 on v100gpu13, 1 GPU, 41003 s
JOB_END = dt.datetime(2024, 4, 5, 11, 42, 0, tzinfo=dt.UTC)


@pytest.fixture()
def loaded(store, realdata):
    store.write(slurm_sacct.parse((realdata / "scheduler/slurm_sacct-parsable-snowman-delim_habrok_gres-gpu.txt").read_bytes(), source="sacct"))
    store.write(F.Batch(site=F.conform(F.SITE, pl.DataFrame([{"site_id": "grn", "name": "Groningen"}])),
                        host=F.conform(F.HOST, pl.DataFrame([{"host": "v100gpu13", "site_id": "grn"}])),
                        gpu=F.conform(F.GPU, pl.DataFrame([{"gpu_uuid": "GPU-v100-13", "host": "v100gpu13", "gpu_index": 0, "model_name": "V100"}]))))
    ts = pl.datetime_range(JOB_START - dt.timedelta(minutes=30), JOB_END + dt.timedelta(minutes=30), "1m", eager=True, time_zone="UTC")
    inside = (ts >= JOB_START) & (ts < JOB_END)
    samples = pl.DataFrame({"ts": ts, "gpu_uuid": "GPU-v100-13",
                            "util_ratio": pl.Series(inside).cast(pl.Float64) * 0.5, "power_w": pl.Series(inside).cast(pl.Float64) * 150 + 50})
    store.write(F.Batch(gpu_sample=F.conform(F.GPU_SAMPLE, samples)))
    serving.record_price(store, {"site_id": "grn", "gpu_model": "", "valid_from": dt.datetime(2024, 1, 1, tzinfo=dt.UTC), "currency": "EUR",
                                 "gpu_hour_price": 2.0, "energy_price_per_kwh": 0.25}, recorded_by="finance")
    return store


def test_mapping_is_recorded_and_audited(loaded):
    out = teams.set_mapping(loaded, kind="slurm_user", match="user420", team="vision", recorded_by="alice", now=dt.datetime(2026, 11, 1, tzinfo=dt.UTC))
    assert out["team"] == "vision" and out["recorded_by"] == "alice"
    assert teams.mappings(loaded).select("kind", "match", "team").rows() == [("slurm_user", "user420", "vision")]
    log = loaded.read("audit_log").sort("seq").filter(pl.col("action") == "team_mapping")
    assert log.select("actor", "subject").rows() == [("alice", "slurm_user:user420")]
    for bad in ({"kind": "unix_group", "match": "x", "team": "t"}, {"kind": "k8s_label", "match": "nolabel", "team": "t"},
                {"kind": "slurm_account", "match": "", "team": "t"}, {"kind": "slurm_account", "match": "a\x00", "team": "t"},
                {"kind": "slurm_account", "match": "a", "team": "x" * 201}):
        with pytest.raises(ValidationError):
            teams.set_mapping(loaded, recorded_by="alice", **bad)


def test_team_usage_busy_energy_cost(loaded):
    teams.set_mapping(loaded, kind="slurm_user", match="user420", team="vision", recorded_by="alice")
    costs = teams.job_costs(loaded, start=APRIL[0], end=APRIL[1], now=APRIL[1])
    j = costs.filter(pl.col("job_id") == "7946767").row(0, named=True)
    assert j["team"] == "vision" and j["gpu_hours"] == pytest.approx(41003 / 3600)
    assert j["used_gpu_hours"] == pytest.approx(41003 / 3600 * 0.5)
    assert j["energy_kwh"] == pytest.approx(200 * 41003 / 3.6e6)  # 200 W while held
    assert j["cost"] == pytest.approx(41003 / 3600 * 2.0 + 200 * 41003 / 3.6e6 * 0.25) and j["currency"] == "EUR"
    u = {r["team"]: r for r in teams.usage(loaded, start=APRIL[0], end=APRIL[1], now=APRIL[1]).to_dicts()}
    # by hand from the sacct rows: GPU jobs of April 2024 clipped to the month
    raw = costs.filter(pl.col("team") == "vision")
    assert u["vision"]["gpu_hours"] == pytest.approx(raw["gpu_hours"].sum()) and u["vision"]["busy_share"] == pytest.approx(0.5)
    assert "unassigned" in u and u["unassigned"]["used_gpu_hours"] is None


def test_queue_and_month(loaded):
    q = teams.queue(loaded, start=dt.datetime(2023, 1, 1, tzinfo=dt.UTC), end=dt.datetime(2025, 1, 1, tzinfo=dt.UTC))
    assert sum(r["jobs"] for r in q["outcomes"]) == 90
    assert teams.month_bounds("2026-11") == (dt.datetime(2026, 11, 1, tzinfo=dt.UTC), dt.datetime(2026, 12, 1, tzinfo=dt.UTC))
    with pytest.raises(ValidationError):
        teams.month_bounds("Nov")
