"""Health reads against the store, for the dashboard, the API and the CLI: unhealthy GPUs, the health grid,
health events over time, by node and most recent, findings by kind and filtered, GPU state counts.

The sweep that writes those findings and events is ``fleetscope.services.health``.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from typing import Any

import polars as pl

from fleetscope.core import frames as F
from fleetscope.core.errors import NotFound
from fleetscope.core.units import as_utc
from fleetscope.services.telemetry import fleet_rows_sql, fleet_size, latest_fields, power_of
from fleetscope.store import Store
from fleetscope.store.reads import bucket_us_sql, fetch, site_gpus_sql, site_hosts_sql

UTC = F.UTC_US


# Health event kinds that make a GPU "unhealthy" on the overview. Throttling (thermal, power) and NCCL
# warnings are worth seeing but do not by themselves mean the GPU should be drained.
UNHEALTHY_KINDS: tuple[str, ...] = ("xid", "ecc", "row_remap", "nvlink", "sdc")
# The live panel's windows: busy or idle by the mean utilisation over ACTIVITY_WINDOW_S; unhealthy by an event
# in HEALTH_WINDOW_S; the grid's hosts cut at GRID_MAX_HOSTS.
ACTIVITY_WINDOW_S = 300
BUSY_UTIL_RATIO = 0.1
HEALTH_WINDOW_S = 3600
GRID_MAX_HOSTS = 64
_GRID_FIELDS = ("temp_c", "power_w", "xid_last")  # the latest sample's fields the grid shows


def unhealthy_gpus(store: Store, start: dt.datetime, end: dt.datetime, site: str | None = None) -> pl.DataFrame:
    """GPUs with a health event of an UNHEALTHY_KINDS kind in ``[start, end)``: ``gpu_uuid, host,
    events, kinds`` (comma-separated), ``last_ts``. Host-level events (no GPU) are left to the grid."""
    params: list[Any] = [as_utc(start), as_utc(end), *UNHEALTHY_KINDS]
    site_sql = site_hosts_sql(site, params)
    kinds = ", ".join("?" for _ in UNHEALTHY_KINDS)
    sql = (
        "SELECT gpu_uuid, MAX(host) AS host, COUNT(*) AS events, MAX(ts) AS last_ts FROM health_event"
        f" WHERE ts >= ? AND ts < ? AND kind IN ({kinds}) AND gpu_uuid <> ''{site_sql} GROUP BY gpu_uuid"
    )
    df = fetch(store, sql, params, {"gpu_uuid": pl.String, "host": pl.String, "events": pl.Int64, "last_ts": UTC})
    kinds_df = fetch(
        store,
        f"SELECT DISTINCT gpu_uuid, kind FROM health_event WHERE ts >= ? AND ts < ? AND kind IN ({kinds}) AND gpu_uuid <> ''{site_sql}",
        params,
        {"gpu_uuid": pl.String, "kind": pl.String},
    )
    kinds_by_gpu = kinds_df.group_by("gpu_uuid").agg(pl.col("kind").sort().str.join(", ").alias("kinds"))
    return df.join(kinds_by_gpu, on="gpu_uuid", how="left").select("gpu_uuid", "host", "events", "kinds", "last_ts").sort("gpu_uuid")


def health_grid(
    store: Store, end: dt.datetime, lookback_s: float | None = None, health_window_s: float = HEALTH_WINDOW_S, site: str | None = None,
    max_hosts: int = GRID_MAX_HOSTS,
) -> pl.DataFrame:
    """Host × GPU grid of the latest temperature, power and XID, with health events in the last
    ``health_window_s``: ``host, gpu_index, gpu_uuid, temp_c, power_w, xid_last, events, status``.

    ``status`` is ``unhealthy`` (an UNHEALTHY_KINDS event in the window: the same rule as
    ``gpu_state_counts``, so grid and counts agree), ``hot`` (≥ 85 °C), ``silent`` (no recent sample) or
    ``ok``; ``xid_last`` is shown, not judged, since DCGM keeps reporting the last XID long after it.
    Hosts are ordered worst first and cut at ``max_hosts``: a 16k-GPU fleet has 2,048 hosts, more than a
    screen shows, and the ones needing attention are the point of the grid.
    """
    end = as_utc(end)
    return _grid(store, end, latest_fields(store, end, _GRID_FIELDS, lookback_s, site), health_window_s, site, max_hosts)


def _grid(store: Store, end: dt.datetime, latest: pl.DataFrame, health_window_s: float, site: str | None, max_hosts: int) -> pl.DataFrame:
    """``health_grid`` from ``latest`` (``latest_fields`` of ``_GRID_FIELDS``)."""
    params: list[Any] = [end - dt.timedelta(seconds=health_window_s), end]
    site_sql = site_hosts_sql(site, params)
    ev = fetch(
        store,
        f"SELECT host, gpu_uuid, kind, COUNT(*) AS events FROM health_event WHERE ts >= ? AND ts < ?{site_sql} GROUP BY host, gpu_uuid, kind",
        params,
        {"host": pl.String, "gpu_uuid": pl.String, "kind": pl.String, "events": pl.Int64},
    )
    ev_gpu = ev.filter(pl.col("gpu_uuid") != "").group_by("gpu_uuid").agg(
        pl.col("events").sum().alias("events"),
        pl.col("kind").is_in(list(UNHEALTHY_KINDS)).any().alias("serious"),
    )
    inv_params: list[Any] = []
    inv_where = ""
    if site is not None:
        inv_where = " WHERE h.site_id = ?"
        inv_params.append(site)
    inventory = fetch(
        store,
        f"SELECT g.gpu_uuid, g.host, g.gpu_index FROM gpu g LEFT JOIN host h ON h.host = g.host{inv_where}",
        inv_params,
        {"gpu_uuid": pl.String, "host": pl.String, "gpu_index": pl.Int64},
    )
    grid = (
        inventory.join(latest.select("gpu_uuid", "ts", "temp_c", "power_w", "xid_last"), on="gpu_uuid", how="full", coalesce=True)
        .join(ev_gpu, on="gpu_uuid", how="left")
        .with_columns(
            pl.col("host").fill_null("(unknown host)"),
            pl.col("gpu_index").fill_null(-1),
            pl.col("events").fill_null(0),
            pl.col("serious").fill_null(False),
        )
    )
    if grid.is_empty():
        return pl.DataFrame(
            schema={"host": pl.String, "gpu_index": pl.Int64, "gpu_uuid": pl.String, "temp_c": pl.Float64, "power_w": pl.Float64,
                    "xid_last": pl.Int64, "events": pl.Int64, "status": pl.String}
        )
    status = (
        pl.when(pl.col("serious"))
        .then(pl.lit("unhealthy"))
        .when(pl.col("ts").is_null())
        .then(pl.lit("silent"))
        .when(pl.col("temp_c").fill_null(0) >= 85)
        .then(pl.lit("hot"))
        .otherwise(pl.lit("ok"))
    )
    grid = grid.with_columns(status=status)
    rank = {"unhealthy": 3, "hot": 2, "silent": 1, "ok": 0}
    worst = (
        grid.group_by("host")
        .agg(pl.col("status").replace_strict(rank, return_dtype=pl.Int64).max().alias("worst"), pl.col("events").sum().alias("host_events"))
        .sort(["worst", "host_events", "host"], descending=[True, True, False])
        .head(max_hosts)
    )
    order = worst.select("host").with_row_index("host_order")
    return (
        grid.join(order, on="host", how="inner")
        .sort("host_order", "gpu_index")
        .select("host", "gpu_index", "gpu_uuid", "temp_c", "power_w", "xid_last", "events", "status")
    )


def health_events_over_time(
    store: Store, start: dt.datetime, end: dt.datetime, bucket_s: int = 3600, site: str | None = None
) -> pl.DataFrame:
    """Health events per time bucket, host and kind: ``ts, host, kind, events``."""
    params: list[Any] = [as_utc(start), as_utc(end)]
    site_sql = site_hosts_sql(site, params)
    bucket = bucket_us_sql(store, "ts", bucket_s)
    sql = (
        f"SELECT {bucket} AS ts, host, kind, COUNT(*) AS events FROM health_event"
        f" WHERE ts >= ? AND ts < ?{site_sql} GROUP BY 1, 2, 3 ORDER BY 1, 2, 3"
    )
    return fetch(store, sql, params, {"ts": UTC, "host": pl.String, "kind": pl.String, "events": pl.Int64})


def health_events_by_node(store: Store, start: dt.datetime, end: dt.datetime, site: str | None = None) -> pl.DataFrame:
    """Per host and kind in the window: ``host, kind, events, gpus`` (distinct GPUs), ``last_ts``;
    hosts with the most events first."""
    params: list[Any] = [as_utc(start), as_utc(end)]
    site_sql = site_hosts_sql(site, params)
    sql = (
        "SELECT host, kind, COUNT(*) AS events, COUNT(DISTINCT NULLIF(gpu_uuid, '')) AS gpus, MAX(ts) AS last_ts"
        f" FROM health_event WHERE ts >= ? AND ts < ?{site_sql} GROUP BY host, kind ORDER BY 3 DESC, 1, 2"
    )
    return fetch(store, sql, params, {"host": pl.String, "kind": pl.String, "events": pl.Int64, "gpus": pl.Int64, "last_ts": UTC})


def health_events_recent(
    store: Store, start: dt.datetime, end: dt.datetime, site: str | None = None, kinds: Sequence[str] | None = None, limit: int = 200
) -> pl.DataFrame:
    """The newest health events in the window (at most ``limit``), newest first."""
    params: list[Any] = [as_utc(start), as_utc(end)]
    kind_sql = ""
    if kinds:
        kind_sql = f" AND kind IN ({', '.join('?' for _ in kinds)})"
        params += list(kinds)
    site_sql = site_hosts_sql(site, params)
    cols = ("ts", "host", "gpu_uuid", "kind", "code", "value", "message", "source")
    sql = f"SELECT {', '.join(cols)} FROM health_event WHERE ts >= ? AND ts < ?{kind_sql}{site_sql} ORDER BY ts DESC LIMIT {int(limit)}"
    return fetch(store, sql, params, {c: F.HEALTH_EVENT.schema[c] for c in cols})


def _finding_window(params: list[Any], start: dt.datetime, end: dt.datetime) -> str:
    # A finding is in the window when its own window overlaps it.
    params += [as_utc(end), as_utc(start)]
    return "window_start < ? AND (window_end IS NULL OR window_end >= ?)"


def findings_by_kind(store: Store, start: dt.datetime, end: dt.datetime, kind_like: str | None = None) -> pl.DataFrame:
    """Findings per analyzer, kind and severity in the window: ``analyzer, kind, severity, findings, last_window_start``."""
    params: list[Any] = []
    where = _finding_window(params, start, end)
    if kind_like:
        where += " AND kind LIKE ?"
        params.append(kind_like)
    sql = (
        "SELECT analyzer, kind, severity, COUNT(*) AS findings, MAX(window_start) AS last_window_start"
        f" FROM finding WHERE {where} GROUP BY analyzer, kind, severity ORDER BY 4 DESC, 1, 2, 3"
    )
    return fetch(
        store,
        sql,
        params,
        {"analyzer": pl.String, "kind": pl.String, "severity": pl.String, "findings": pl.Int64, "last_window_start": UTC},
    )


def findings(
    store: Store,
    start: dt.datetime,
    end: dt.datetime,
    kind_like: str | None = None,
    subject_like: str | None = None,
    limit: int = 200,
    analyzer: str | None = None,
) -> pl.DataFrame:
    """The newest findings in the window (of one ``analyzer`` if given), most severe first within a window."""
    params: list[Any] = []
    where = _finding_window(params, start, end)
    if kind_like:
        where += " AND kind LIKE ?"
        params.append(kind_like)
    if analyzer:
        where += " AND analyzer = ?"
        params.append(analyzer)
    if subject_like:
        where += " AND subject LIKE ?"
        params.append(subject_like)
    cols = ("window_start", "window_end", "analyzer", "kind", "subject", "severity", "score", "summary", "evidence")
    sql = (
        f"SELECT {', '.join(cols)} FROM finding WHERE {where}"
        " ORDER BY window_start DESC, CASE severity WHEN 'critical' THEN 0 WHEN 'warning' THEN 1 ELSE 2 END, COALESCE(score, 0) DESC"
        f" LIMIT {int(limit)}"
    )
    return fetch(store, sql, params, {c: F.FINDING.schema[c] for c in cols})


def gpu_state_counts(
    store: Store,
    end: dt.datetime,
    window_s: float = ACTIVITY_WINDOW_S,
    busy_util_ratio: float = BUSY_UTIL_RATIO,
    health_window_s: float = HEALTH_WINDOW_S,
    site: str | None = None,
) -> pl.DataFrame:
    """One row splitting the fleet into disjoint states at ``end``:

    ``gpus`` (inventory) = ``unhealthy`` (a serious health event in the last ``health_window_s``)
    + ``busy`` / ``idle`` (reporting, mean utilisation over ``window_s`` at or above / below the threshold)
    + ``silent`` (in the inventory, no sample in the window). ``reporting`` counts GPUs with samples,
    including ones not (yet) in the inventory.
    """
    return _state_counts(store, as_utc(end), fleet_size(store, site), window_s, busy_util_ratio, health_window_s, site)


def _state_counts(store: Store, end: dt.datetime, size: pl.DataFrame, window_s: float, busy_util_ratio: float, health_window_s: float,
                  site: str | None) -> pl.DataFrame:
    """``gpu_state_counts`` with the fleet's ``fleet_size`` read already."""
    inventory = int(size["gpus"][0]) if size.height else 0
    # Each GPU's state is decided in the database and only the five counts come back: the fleet's GPUs
    # (100,000 rows at the largest sites) never travel to this process.
    start = end - dt.timedelta(seconds=window_s)
    params: list[Any] = []
    act_site = site_gpus_sql(site, params)
    params += [end - dt.timedelta(seconds=health_window_s), end, *UNHEALTHY_KINDS]
    bad_site = site_hosts_sql(site, params)
    params += [busy_util_ratio, busy_util_ratio]
    kinds = ", ".join("?" for _ in UNHEALTHY_KINDS)
    sql = (
        "SELECT SUM(rep) AS reporting, SUM(CASE WHEN rep = 1 AND bad = 0 AND u >= ? THEN 1 ELSE 0 END) AS busy,"
        " SUM(CASE WHEN rep = 1 AND bad = 0 AND u < ? THEN 1 ELSE 0 END) AS idle, SUM(bad) AS unhealthy,"
        " SUM(CASE WHEN rep = 0 THEN 1 ELSE 0 END) AS bad_silent FROM ("
        " SELECT gpu_uuid, MAX(rep) AS rep, MAX(bad) AS bad, COALESCE(MAX(u), 0) AS u FROM ("
        f" SELECT gpu_uuid, 1 AS rep, 0 AS bad, AVG(util_ratio) AS u FROM {fleet_rows_sql(store, start, end, ('util_ratio',), 'a', 'mean')}"
        f" WHERE TRUE{act_site} GROUP BY gpu_uuid"
        " UNION ALL SELECT gpu_uuid, 0 AS rep, 1 AS bad, NULL AS u FROM (SELECT DISTINCT gpu_uuid FROM health_event"
        f" WHERE ts >= ? AND ts < ? AND kind IN ({kinds}) AND gpu_uuid <> ''{bad_site}) b) z GROUP BY gpu_uuid) y"
    )
    # the two thresholds are the outer query's first placeholders
    params = params[-2:] + params[:-2]
    c = {k: int(v or 0) for k, v in fetch(store, sql, params, {k: pl.Int64 for k in ("reporting", "busy", "idle", "unhealthy", "bad_silent")}, small=True).row(0, named=True).items()}
    silent = max(0, inventory - c["reporting"] - c["bad_silent"])
    return pl.DataFrame(
        {"gpus": [max(inventory, c["reporting"])], "reporting": [c["reporting"]], "busy": [c["busy"]], "idle": [c["idle"]],
         "unhealthy": [c["unhealthy"]], "silent": [silent]},
        schema={k: pl.Int64 for k in ("gpus", "reporting", "busy", "idle", "unhealthy", "silent")},
    )


def live_state(store: Store, end: dt.datetime, site: str | None = None) -> dict[str, pl.DataFrame]:
    """What the Overview's live panel shows, in one read: ``size`` (``fleet_size``), ``counts``
    (``gpu_state_counts``), ``power`` (``power_now``'s row) and ``grid`` (``health_grid``), each with its
    defaults. The power now and the grid come from one read of every GPU's latest sample, and the counts
    reuse the inventory's size: read apart, the three panels scanned the newest raw rows twice and counted the
    inventory twice, which at 100,000 GPUs was most of the page's first visit. Anchored in an hour held packed
    (a past time in the page's URL) they read the minute tier (``telemetry.fleet_rows_sql``): unpacking the hour for
    every GPU doubled the panel's time at 1,024 GPUs."""
    end = as_utc(end)
    size = fleet_size(store, site)
    latest = latest_fields(store, end, _GRID_FIELDS, None, site)
    return {
        "size": size,
        "counts": _state_counts(store, end, size, ACTIVITY_WINDOW_S, BUSY_UTIL_RATIO, HEALTH_WINDOW_S, site),
        "power": power_of(latest),
        "grid": _grid(store, end, latest, HEALTH_WINDOW_S, site, GRID_MAX_HOSTS),
    }


def fleet_state(store: Store, end: dt.datetime, site: str | None = None, problems_only: bool = False) -> dict[str, Any]:
    """``live_state`` as plain values, for ``GET /api/v1/fleet/state`` and ``fleetscope fleet state``: ``as_of``,
    ``site``, the inventory's ``sites, hosts, gpus``, the state ``counts``, ``power`` now, the windows and
    thresholds that decide the states, and the ``grid`` of the worst ``GRID_MAX_HOSTS`` hosts' GPUs (only the
    GPUs that are not ``ok`` with ``problems_only``). ``NotFound`` for a site with no GPU in the inventory:
    a mistyped name must not read as a fleet of zero GPUs."""
    end = as_utc(end)
    state = live_state(store, end, site)
    size = state["size"].row(0, named=True) if state["size"].height else {"sites": 0, "hosts": 0, "gpus": 0}
    if site is not None and not size["sites"]:
        raise NotFound(f"no GPU at site {site!r} in the inventory")
    grid = state["grid"]
    if problems_only:
        grid = grid.filter(pl.col("status") != "ok")
    return {
        "as_of": end,
        "site": site,
        "inventory": {k: int(size[k] or 0) for k in ("sites", "hosts", "gpus")},
        "counts": state["counts"].row(0, named=True),
        "power": state["power"].row(0, named=True),
        "rules": {"activity_window_s": ACTIVITY_WINDOW_S, "busy_util_ratio": BUSY_UTIL_RATIO, "health_window_s": HEALTH_WINDOW_S,
                  "unhealthy_kinds": list(UNHEALTHY_KINDS), "grid_max_hosts": GRID_MAX_HOSTS},
        "grid": grid.to_dicts(),
    }
