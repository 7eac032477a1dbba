"""Showback and chargeback: which team each scheduler job belongs to, and per team and period the GPU-hours
allocated and used, the energy of the GPUs it held, and their cost from the price book.

Teams. A mapping (``team_mapping``) names the team of a Kubernetes label (``k8s_label``, ``key=value``), a
Slurm account or Kubernetes namespace (``slurm_account``, ``k8s_namespace``; both are the job's
``account``), a Slurm account's organization (``slurm_organization``, from slurmdbd's accounts: the account
hierarchy of SOURCES.md's 981-node fleet) or a user (``slurm_user``). The most specific rule wins, in that
order, a cluster-specific rule before one for every cluster; a job no rule names is ``unassigned`` (so
nothing is silently dropped from a bill).

Figures, for jobs overlapping ``[start, end)``:

- **allocated GPU-hours**: GPUs × the part of the run inside the period (``analyzers.scheduler.allocated_gpu_seconds``);
- **used GPU-hours**: allocated × the busy share of the job's GPUs, the mean ``util_ratio`` of their samples
  while the job held them (DCGM_FI_DEV_GPU_UTIL, the share of time a kernel ran); null where no telemetry
  reached the job's GPUs;
- **energy**: the mean power of those samples × the time held, per GPU (kWh);
- **cost**: allocated GPU-hours at the GPU-hour price valid at the job's (clipped) start for its site and GPU
  model (or the site's any-GPU price), plus energy at the site's tariff — the price book of
  ``services/serving.py`` (FinOps Foundation's showback: allocation-based cost, priced by unit rate).

Pure: polars frames in, frames out.
"""

from __future__ import annotations

import datetime as dt
import json

import polars as pl

from analyzers.serving_energy import price_at
from fleetscope.core.slurm import expand_hostlist

UNASSIGNED = "unassigned"
KINDS = ("k8s_label", "slurm_account", "k8s_namespace", "slurm_organization", "slurm_user")
J_PER_KWH = 3.6e6


def assign_teams(jobs: pl.DataFrame, mapping: pl.DataFrame, accounts: pl.DataFrame | None = None) -> pl.DataFrame:
    """``jobs`` with ``team`` and ``team_rule`` (``kind:match``, or null for unassigned)."""
    rules: dict[tuple[str, str, str], str] = {}
    for r in mapping.iter_rows(named=True) if mapping.height else []:
        rules[(r["kind"], r["match"], r.get("cluster") or "")] = r["team"]
    orgs: dict[tuple[str, str], str] = {}
    if accounts is not None and accounts.height:
        for r in accounts.iter_rows(named=True):
            if r.get("organization"):
                orgs[(r.get("cluster") or "", r["account"])] = r["organization"]
                orgs.setdefault(("", r["account"]), r["organization"])

    def find(kind: str, match: str | None, cluster: str) -> str | None:
        if not match:
            return None
        return rules.get((kind, match, cluster)) or rules.get((kind, match, ""))

    teams, why = [], []
    cols = jobs.columns
    for r in jobs.iter_rows(named=True):
        cluster = r.get("cluster") or ""
        team = rule = None
        if "labels" in cols and r.get("labels"):
            try:
                labels = json.loads(r["labels"])
            except ValueError:
                labels = {}
            for k, v in sorted(labels.items()):
                if (t := find("k8s_label", f"{k}={v}", cluster)) is not None:
                    team, rule = t, f"k8s_label:{k}={v}"
                    break
        kind = "k8s_namespace" if r.get("scheduler") == "kubernetes" else "slurm_account"
        if team is None and (t := find(kind, r.get("account"), cluster)) is not None:
            team, rule = t, f"{kind}:{r['account']}"
        if team is None and r.get("account"):
            org = orgs.get((cluster, r["account"])) or orgs.get(("", r["account"]))
            if org and (t := find("slurm_organization", org, cluster)) is not None:
                team, rule = t, f"slurm_organization:{org}"
        if team is None and (t := find("slurm_user", r.get("user"), cluster)) is not None:
            team, rule = t, f"slurm_user:{r['user']}"
        teams.append(team or UNASSIGNED)
        why.append(rule)
    return jobs.with_columns(pl.Series("team", teams, pl.String), pl.Series("team_rule", why, pl.String))



def job_costs(alloc: pl.DataFrame, *, busy: pl.DataFrame | None, prices: pl.DataFrame, sites: dict[str, str], start: dt.datetime) -> pl.DataFrame:
    """Per job: allocated and used GPU-hours, energy, GPU and energy cost and currency.

    ``alloc`` is ``allocated_gpu_seconds`` output with ``team``; ``busy`` per (cluster, job_id) has
    ``busy_ratio`` and ``energy_j`` from telemetry (null where none); ``sites`` maps a job's first host to its
    site."""
    df = alloc
    if busy is not None and busy.height:
        df = df.join(busy.select("cluster", "job_id", "busy_ratio", "energy_j"), on=["cluster", "job_id"], how="left")
    else:
        df = df.with_columns(pl.lit(None, pl.Float64).alias("busy_ratio"), pl.lit(None, pl.Float64).alias("energy_j"))
    rows = []
    for r in df.iter_rows(named=True):
        hosts = expand_hostlist(r.get("nodes")) if r.get("nodes") else []
        site = sites.get(hosts[0]) if hosts else None
        model = (r.get("gpu_types") or "").split(",")[0].split(":")[0] if r.get("gpu_types") else ""
        at = max(r["start_at"], start)
        gpu_price, cur = price_at(prices, site, model, at, "gpu_hour_price")
        tariff, cur2 = price_at(prices, site, "", at, "energy_price_per_kwh")
        gpu_h = r["gpu_s"] / 3600
        kwh = r["energy_j"] / J_PER_KWH if r.get("energy_j") is not None else None
        gpu_cost = gpu_h * gpu_price if gpu_price is not None else None
        energy_cost = kwh * tariff if kwh is not None and tariff is not None else None
        rows.append({"cluster": r.get("cluster") or "", "job_id": r["job_id"], "team": r["team"], "account": r.get("account"), "user": r.get("user"),
                     "partition": r.get("partition"), "state": r.get("state"), "site_id": site, "gpu_model": model or None,
                     "gpu_hours": gpu_h, "used_gpu_hours": gpu_h * r["busy_ratio"] if r.get("busy_ratio") is not None else None,
                     "energy_kwh": kwh, "gpu_cost": gpu_cost, "energy_cost": energy_cost,
                     "cost": (gpu_cost or 0.0) + (energy_cost or 0.0) if gpu_cost is not None or energy_cost is not None else None,
                     "currency": cur or cur2})
    schema = {"cluster": pl.String, "job_id": pl.String, "team": pl.String, "account": pl.String, "user": pl.String, "partition": pl.String,
              "state": pl.String, "site_id": pl.String, "gpu_model": pl.String, "gpu_hours": pl.Float64, "used_gpu_hours": pl.Float64,
              "energy_kwh": pl.Float64, "gpu_cost": pl.Float64, "energy_cost": pl.Float64, "cost": pl.Float64, "currency": pl.String}
    return pl.DataFrame(rows, schema=schema)


def team_totals(costs: pl.DataFrame) -> pl.DataFrame:
    """Per team: jobs, GPU-hours allocated and used, busy share, energy and cost (sums; a currency per team)."""
    return (costs.group_by("team").agg(
        pl.len().alias("jobs"), pl.col("gpu_hours").sum(), pl.col("used_gpu_hours").sum(),
        pl.col("used_gpu_hours").is_not_null().any().alias("_has_used"),
        (pl.col("gpu_hours").filter(pl.col("used_gpu_hours").is_not_null()).sum()).alias("_measured_h"),
        pl.col("energy_kwh").sum(), pl.col("cost").sum(), pl.col("currency").drop_nulls().first())
        .with_columns(pl.when(pl.col("_has_used")).then(pl.col("used_gpu_hours")).otherwise(None).alias("used_gpu_hours"),
                      pl.when(pl.col("_measured_h") > 0).then(pl.col("used_gpu_hours") / pl.col("_measured_h")).otherwise(None).alias("busy_share"))
        .drop("_has_used", "_measured_h").sort("gpu_hours", descending=True))
