"""Chargeback's vectorised job costs against the per-job reading of the price book they replace (one
``price_at`` per job and price): same rows, same figures, on jobs spread over sites, models, price changes
and missing data."""

import datetime as dt
import random

import polars as pl
import pytest
from polars.testing import assert_frame_equal

from analyzers import chargeback as C
from analyzers.serving_energy import price_at
from fleetscope.core.slurm import expand_hostlist

T0 = dt.datetime(2026, 11, 1, tzinfo=dt.UTC)


def reference_job_costs(alloc, *, busy, prices, sites, start):
    """One job at a time, as chargeback priced them before: the meaning the vectorised version must keep."""
    df = alloc.join(busy.select("cluster", "job_id", "busy_ratio", "energy_j"), on=["cluster", "job_id"], how="left", maintain_order="left")
    rows = []
    for r in df.iter_rows(named=True):
        hosts = expand_hostlist(r.get("nodes")) if r.get("nodes") else []
        site = sites.get(hosts[0]) if hosts else None
        model = (r.get("gpu_types") or "").split(",")[0].split(":")[0] if r.get("gpu_types") else ""
        at = max(r["start_at"], start)
        gpu_price, cur = price_at(prices, site, model, at, "gpu_hour_price")
        tariff, cur2 = price_at(prices, site, "", at, "energy_price_per_kwh")
        gpu_h = r["gpu_s"] / 3600
        kwh = r["energy_j"] / C.J_PER_KWH if r.get("energy_j") is not None else None
        gpu_cost = gpu_h * gpu_price if gpu_price is not None else None
        energy_cost = kwh * tariff if kwh is not None and tariff is not None else None
        rows.append({"cluster": r.get("cluster") or "", "job_id": r["job_id"], "team": r["team"], "account": r.get("account"), "user": r.get("user"),
                     "partition": r.get("partition"), "state": r.get("state"), "site_id": site, "gpu_model": model or None,
                     "gpu_hours": gpu_h, "used_gpu_hours": gpu_h * r["busy_ratio"] if r.get("busy_ratio") is not None else None,
                     "energy_kwh": kwh, "gpu_cost": gpu_cost, "energy_cost": energy_cost,
                     "cost": (gpu_cost or 0.0) + (energy_cost or 0.0) if gpu_cost is not None or energy_cost is not None else None,
                     "currency": cur or cur2})
    return pl.DataFrame(rows, schema=C.JOB_COST_SCHEMA)


def _book():
    rows = [("a", "", T0 - dt.timedelta(days=30), "EUR", 2.0, 0.20), ("a", "a100", T0 - dt.timedelta(days=30), "EUR", 3.0, None),
            ("a", "a100", T0 + dt.timedelta(days=10), "EUR", 3.5, None), ("a", "", T0 + dt.timedelta(days=20), "EUR", 2.2, 0.30),
            ("b", "h100", T0 + dt.timedelta(days=5), "USD", 6.0, None),  # b: a model price only, from the 6th; no tariff
            ("c", "", T0 + dt.timedelta(days=15), "CHF", None, 0.15)]  # c: a tariff only
    return pl.DataFrame(rows, schema={"site_id": pl.String, "gpu_model": pl.String, "valid_from": pl.Datetime("us", "UTC"), "currency": pl.String,
                                      "gpu_hour_price": pl.Float64, "energy_price_per_kwh": pl.Float64}, orient="row")


def _jobs(n: int, seed: int):
    rnd = random.Random(seed)
    nodes = [None, "", "a[01-04]", "a07", "b[1-2,9]", "c01,a02", "zz01", "b[3-4]"]
    types = [None, "", "a100:4", "h100:8,a100:1", "v100", "h100"]
    rows, busy = [], []
    for i in range(n):
        start = T0 + dt.timedelta(hours=rnd.randint(-200, 700))
        rows.append({"cluster": rnd.choice(["", "hpc", None]), "job_id": str(i), "team": rnd.choice(["x", "y", C.UNASSIGNED]),
                     "account": rnd.choice(["acc", None]), "user": "u", "partition": rnd.choice(["gpu", None]), "state": "COMPLETED",
                     "nodes": rnd.choice(nodes), "gpu_types": rnd.choice(types), "start_at": start, "gpu_s": rnd.uniform(1, 1e6)})
        if rnd.random() < 0.7:
            busy.append({"cluster": rows[-1]["cluster"] or "", "job_id": str(i), "busy_ratio": rnd.choice([None, rnd.random()]),
                         "energy_j": rnd.choice([None, rnd.uniform(0, 1e9)])})
    alloc = pl.DataFrame(rows, schema={"cluster": pl.String, "job_id": pl.String, "team": pl.String, "account": pl.String, "user": pl.String,
                                       "partition": pl.String, "state": pl.String, "nodes": pl.String, "gpu_types": pl.String,
                                       "start_at": pl.Datetime("us", "UTC"), "gpu_s": pl.Float64})
    alloc = alloc.with_columns(pl.col("cluster").fill_null(""))
    return alloc, pl.DataFrame(busy, schema={"cluster": pl.String, "job_id": pl.String, "busy_ratio": pl.Float64, "energy_j": pl.Float64})


SITES = {"a01": "a", "a02": "a", "a07": "a", "b1": "b", "b3": "b", "c01": "c"}


@pytest.mark.parametrize("seed", [1, 2])
def test_vectorised_job_costs_match_the_per_job_reading(seed):
    alloc, busy = _jobs(400, seed)
    got = C.job_costs(alloc, busy=busy, prices=_book(), sites=SITES, start=T0)
    want = reference_job_costs(alloc, busy=busy, prices=_book(), sites=SITES, start=T0)
    assert got.schema == want.schema and got.height == want.height == 400
    # nulls where they were; floats to the last bit or one rounding away (polars divides by 3600 as a product)
    assert_frame_equal(got, want, rel_tol=1e-15, abs_tol=0.0)
    # the data exercised every branch: model prices, any-GPU fallback, price changes, unpriced sites, tariffs alone
    assert set(got["currency"].drop_nulls()) == {"EUR", "USD", "CHF"} and got["cost"].null_count() > 0
    assert got.filter(pl.col("gpu_model") == "a100")["gpu_cost"].drop_nulls().len() > 0


def test_hand_priced_job():
    alloc = pl.DataFrame({"cluster": ["hpc"], "job_id": ["1"], "team": ["x"], "nodes": ["a[01-02]"], "gpu_types": ["a100:8"],
                          "start_at": [T0 + dt.timedelta(days=12)], "gpu_s": [8 * 3600.0]},
                         schema_overrides={"start_at": pl.Datetime("us", "UTC")})
    busy = pl.DataFrame({"cluster": ["hpc"], "job_id": ["1"], "busy_ratio": [0.25], "energy_j": [7.2e6]})
    r = C.job_costs(alloc, busy=busy, prices=_book(), sites=SITES, start=T0).row(0, named=True)
    # 8 GPU-h at the a100 price valid on the 12th (3.5 from the 10th) + 2 kWh at the site tariff then (0.20)
    assert (r["site_id"], r["gpu_model"], r["gpu_hours"], r["used_gpu_hours"]) == ("a", "a100", 8.0, 2.0)
    assert r["cost"] == pytest.approx(8 * 3.5 + 2 * 0.20) and r["currency"] == "EUR"
    assert C.job_costs(alloc.clear(), busy=None, prices=_book(), sites=SITES, start=T0).schema == C.JOB_COST_SCHEMA


def test_teams_assigned_once_per_distinct_owner_as_per_job():
    rnd = random.Random(5)
    mapping = pl.DataFrame([("slurm_account", "a1", "", "t1"), ("slurm_account", "a1", "hpc", "t1-hpc"), ("slurm_organization", "org2", "", "t2"),
                            ("slurm_user", "u3", "", "t3"), ("k8s_namespace", "ns", "", "t4"), ("k8s_label", "team=vision", "", "t5")],
                           schema=["kind", "match", "cluster", "team"], orient="row")
    accounts = pl.DataFrame({"cluster": ["", "hpc"], "account": ["a2", "a3"], "organization": ["org2", "org2"]})
    jobs = pl.DataFrame([{"cluster": rnd.choice(["", "hpc", None]), "job_id": str(i), "scheduler": rnd.choice(["slurm", "kubernetes", None]),
                          "account": rnd.choice(["a1", "a2", "a3", "ns", None]), "user": rnd.choice(["u1", "u3", None]),
                          "labels": rnd.choice([None, '{"team": "vision"}', '{"x": "y"}', "not json"])} for i in range(2000)])
    got = C.assign_teams(jobs, mapping, accounts)
    assert got.equals(C._assign(jobs, mapping, accounts))
    assert set(got["team"]) == {"t1", "t1-hpc", "t2", "t3", "t4", "t5", C.UNASSIGNED}
