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
- **CO2e**: that energy × its site's grid intensity, location-based and market-based side by side (GHG
  Protocol Scope 2 Guidance, 2015, ch. 6: dual reporting). A site's intensity for the period is its Scope 2
  over its own energy (``analyzers.carbon.scope2`` as ``services.energy.site_scope2`` computes it), so each
  kWh a job drew there carries the site's average, as ``analyzers.carbon.allocate_scope2`` shares it out;
- **cost**: allocated GPU-hours at the GPU-hour price valid at the job's (clipped) start for its site and GPU
  model (or the site's any-GPU price), plus energy at the site's tariff — the price book of
  ``services/serving.py`` (FinOps Foundation's showback: allocation-based cost, priced by unit rate).

Pure: polars frames in, frames out.
"""

from __future__ import annotations

import datetime as dt
import json
import re

import polars as pl

from fleetscope.core.slurm import expand_hostlist

UNASSIGNED = "unassigned"
KINDS = ("k8s_label", "slurm_account", "k8s_namespace", "slurm_organization", "slurm_user")
J_PER_KWH = 3.6e6


_RULE_KEYS = ("cluster", "scheduler", "account", "user", "labels")


def assign_teams(jobs: pl.DataFrame, mapping: pl.DataFrame, accounts: pl.DataFrame | None = None) -> pl.DataFrame:
    """``jobs`` with ``team`` and ``team_rule`` (``kind:match``, or null for unassigned). The rules are applied
    once per distinct (cluster, scheduler, account, user, labels): a month of jobs has few of those."""
    keys = [c for c in _RULE_KEYS if c in jobs.columns]
    if not jobs.height:
        return jobs.with_columns(pl.lit(None, pl.String).alias("team"), pl.lit(None, pl.String).alias("team_rule"))
    distinct = _assign(jobs.select(keys).unique(maintain_order=True), mapping, accounts)
    return jobs.join(distinct, on=keys, how="left", nulls_equal=True, maintain_order="left")


def _assign(jobs: pl.DataFrame, mapping: pl.DataFrame, accounts: pl.DataFrame | None = None) -> pl.DataFrame:
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



_BRACKET = re.compile(r"\[([^\]]*)\]")


def _first_ranges(nodes: str) -> str:
    """``nodes`` cut to what names its first host: each bracket's first value (``gpu[0001-0064,0070]`` ->
    ``gpu[0001]``), so a 64-node list is not expanded to take one name. Slurm pads a range's values to its
    lower bound's width, so the first value alone expands to the same name."""
    return _BRACKET.sub(lambda m: "[" + m.group(1).split(",")[0].split("-")[0].strip() + "]", nodes) if "[" in nodes else nodes


def _first_hosts(nodes: pl.Series) -> pl.Series:
    """The first host of each node list (``node[01-04]`` -> ``node01``), expanding each distinct list once."""
    uniq = [n for n in nodes.drop_nulls().unique().to_list() if n]
    first = {n: (h[0] if (h := expand_hostlist(_first_ranges(n))) else None) for n in uniq}
    return nodes.replace_strict(first, default=None, return_dtype=pl.String) if first else pl.Series(nodes.name, [None] * len(nodes), pl.String)


def _price_asof(df: pl.DataFrame, prices: pl.DataFrame, col: str, model_col: str, out: str) -> pl.DataFrame:
    """``df`` (with ``_i``, ``site_id``, ``model_col``, ``_at``) with ``out`` and ``out_currency``: the newest
    ``col`` price valid at ``_at`` for the site and model, else the site's any-GPU price (``price_at``, as one
    as-of join per model choice instead of a filter per row)."""
    book = (prices.filter(pl.col(col).is_not_null()).select("site_id", "gpu_model", "valid_from", pl.col(col).alias(out),
                                                                pl.col("currency").alias(f"{out}_currency")).sort("valid_from")
            if prices.height else pl.DataFrame(schema={"site_id": pl.String, "gpu_model": pl.String, "valid_from": pl.Datetime("us", "UTC"),
                                                       out: pl.Float64, f"{out}_currency": pl.String}))
    left = df.select("_i", "site_id", pl.col(model_col).fill_null("").alias("_m"), "_at").sort("_at")
    cols = [out, f"{out}_currency"]
    hits = []
    for model in ("_m", None):  # the model's own price first, then the site's any-GPU price
        key = left.with_columns(pl.lit("").alias("_m")) if model is None else left
        hits.append(key.join_asof(book.rename({"gpu_model": "_m"}), left_on="_at", right_on="valid_from", by=["site_id", "_m"],
                                  strategy="backward", check_sortedness=False).select("_i", *cols))
    a, b = hits
    both = a.join(b, on="_i", suffix="_any")
    pick = pl.col(out).is_not_null()
    return df.join(both.select("_i", pl.when(pick).then(pl.col(out)).otherwise(pl.col(f"{out}_any")).alias(out),
                               pl.when(pick).then(pl.col(f"{out}_currency")).otherwise(pl.col(f"{out}_currency_any")).alias(f"{out}_currency")),
                   on="_i", how="left")


JOB_COST_SCHEMA = {"cluster": pl.String, "job_id": pl.String, "team": pl.String, "account": pl.String, "user": pl.String, "partition": pl.String,
                   "state": pl.String, "site_id": pl.String, "gpu_model": pl.String, "gpu_hours": pl.Float64, "used_gpu_hours": pl.Float64,
                   "energy_kwh": pl.Float64, "gpu_cost": pl.Float64, "energy_cost": pl.Float64, "cost": pl.Float64, "currency": pl.String}


def job_costs(alloc: pl.DataFrame, *, busy: pl.DataFrame | None, prices: pl.DataFrame, sites: dict[str, str], start: dt.datetime) -> pl.DataFrame:
    """Per job: allocated and used GPU-hours, energy, GPU and energy cost and currency.

    ``alloc`` is ``allocated_gpu_seconds`` output with ``team``; ``busy`` per (cluster, job_id) has
    ``busy_ratio`` and ``energy_j`` from telemetry (null where none); ``sites`` maps a job's first host to its
    site. Prices are those ``price_at`` picks, valid at the job's start clipped to the period."""
    if not alloc.height:
        return pl.DataFrame(schema=JOB_COST_SCHEMA)
    df = alloc
    if busy is not None and busy.height:
        df = df.join(busy.select("cluster", "job_id", "busy_ratio", "energy_j"), on=["cluster", "job_id"], how="left", maintain_order="left")
    else:
        df = df.with_columns(pl.lit(None, pl.Float64).alias("busy_ratio"), pl.lit(None, pl.Float64).alias("energy_j"))
    opt = [c for c in ("account", "user", "partition", "state", "nodes", "gpu_types", "cluster") if c not in df.columns]
    df = df.with_columns([pl.lit(None, pl.String).alias(c) for c in opt])
    first = _first_hosts(df["nodes"])
    site = first.replace_strict(sites, default=None, return_dtype=pl.String) if sites else pl.Series([None] * df.height, dtype=pl.String)
    model = pl.col("gpu_types").str.split(",").list.first().str.split(":").list.first()
    lo = pl.lit(start).cast(pl.Datetime("us", "UTC"))
    df = df.with_row_index("_i").with_columns(site.alias("site_id"), model.alias("_model"), pl.max_horizontal("start_at", lo).alias("_at"))
    df = _price_asof(df, prices, "gpu_hour_price", "_model", "_gpu_price")
    df = _price_asof(df.with_columns(pl.lit("").alias("_any")), prices, "energy_price_per_kwh", "_any", "_tariff")
    gpu_h = pl.col("gpu_s") / 3600
    kwh = pl.col("energy_j") / J_PER_KWH
    return (df.sort("_i").with_columns(gpu_h.alias("gpu_hours"), kwh.alias("energy_kwh"))
            .with_columns((pl.col("gpu_hours") * pl.col("_gpu_price")).alias("gpu_cost"), (pl.col("energy_kwh") * pl.col("_tariff")).alias("energy_cost"),
                          (pl.col("gpu_hours") * pl.col("busy_ratio")).alias("used_gpu_hours"))
            .with_columns(pl.when(pl.col("gpu_cost").is_not_null() | pl.col("energy_cost").is_not_null())
                          .then(pl.col("gpu_cost").fill_null(0.0) + pl.col("energy_cost").fill_null(0.0)).alias("cost"),
                          pl.coalesce("_gpu_price_currency", "_tariff_currency").alias("currency"),
                          pl.col("cluster").fill_null(""),
                          pl.when(pl.col("_model") != "").then(pl.col("_model")).alias("gpu_model"))
            .select([pl.col(c).cast(t) for c, t in JOB_COST_SCHEMA.items()]))


CARBON_RATE_SCHEMA = {"site_id": pl.String, "location_g_per_kwh": pl.Float64, "market_g_per_kwh": pl.Float64, "carbon_basis": pl.String}


def with_carbon(costs: pl.DataFrame, rates: pl.DataFrame) -> pl.DataFrame:
    """``costs`` (``job_costs`` rows) with ``location_kgco2e`` and ``market_kgco2e``: each job's energy at its
    site's location- and market-based intensity over the period (``rates``: ``CARBON_RATE_SCHEMA``); null
    where the job's energy or its site's intensity is unknown (kg = kWh × g/kWh / 1000, Patterson et al.
    2021 §2.5)."""
    r = rates.select(list(CARBON_RATE_SCHEMA)) if rates.height else pl.DataFrame(schema=CARBON_RATE_SCHEMA)
    return (costs.join(r.unique("site_id"), on="site_id", how="left", maintain_order="left")
            .with_columns((pl.col("energy_kwh") * pl.col("location_g_per_kwh") / 1000).alias("location_kgco2e"),
                          (pl.col("energy_kwh") * pl.col("market_g_per_kwh") / 1000).alias("market_kgco2e"))
            .drop("location_g_per_kwh", "market_g_per_kwh", "carbon_basis"))


def team_totals(costs: pl.DataFrame) -> pl.DataFrame:
    """Per team: jobs, GPU-hours allocated and used, busy share, energy, CO2e (location- and market-based,
    where ``costs`` has them: :func:`with_carbon`) and cost (sums; a currency per team)."""
    co2 = [pl.col(c).sum() for c in ("location_kgco2e", "market_kgco2e") if c in costs.columns]
    return (costs.group_by("team").agg(
        pl.len().alias("jobs"), pl.col("gpu_hours").sum(), pl.col("used_gpu_hours").sum(),
        pl.col("used_gpu_hours").is_not_null().any().alias("_has_used"),
        (pl.col("gpu_hours").filter(pl.col("used_gpu_hours").is_not_null()).sum()).alias("_measured_h"),
        pl.col("energy_kwh").sum(), *co2, pl.col("cost").sum(), pl.col("currency").drop_nulls().first())
        .with_columns(pl.when(pl.col("_has_used")).then(pl.col("used_gpu_hours")).otherwise(None).alias("used_gpu_hours"),
                      pl.when(pl.col("_measured_h") > 0).then(pl.col("used_gpu_hours") / pl.col("_measured_h")).otherwise(None).alias("busy_share"))
        .drop("_has_used", "_measured_h").sort("gpu_hours", descending=True))
