"""Fabric reads: nccl-tests runs and their sizes, collective bus bandwidth, InfiniBand link findings and
the HCAs' link rates from the topology."""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from typing import Any

import polars as pl

from fleetscope.core import frames as F
from fleetscope.core.units import as_utc
from fleetscope.services.job_reads import jobs
from fleetscope.store import Store
from fleetscope.store.reads import fetch
from analyzers import ib_links


UTC = F.UTC_US


def nccl_test_runs(store: Store, start: dt.datetime, end: dt.datetime, limit: int = 200) -> pl.DataFrame:
    """One row per nccl-tests run in the window, newest first: ``run_id, ts, op, nranks, hosts, sizes,
    busbw_max_gbps, busbw_avg_gbps`` (the average over sizes, as nccl-tests' "Avg bus bandwidth")."""
    sql = (
        "SELECT run_id, MIN(ts) AS ts, MIN(op) AS op, MAX(nranks) AS nranks, MAX(hosts) AS hosts,"
        " COUNT(DISTINCT size_bytes) AS sizes, MAX(busbw_gbps) AS busbw_max_gbps, AVG(busbw_gbps) AS busbw_avg_gbps"
        f" FROM nccl_test WHERE ts >= ? AND ts < ? GROUP BY run_id ORDER BY 2 DESC LIMIT {int(limit)}"
    )
    schema = {
        "run_id": pl.String,
        "ts": UTC,
        "op": pl.String,
        "nranks": pl.Int64,
        "hosts": pl.String,
        "sizes": pl.Int64,
        "busbw_max_gbps": pl.Float64,
        "busbw_avg_gbps": pl.Float64,
    }
    return fetch(store, sql, [as_utc(start), as_utc(end)], schema)


def nccl_test_sizes(store: Store, run_ids: Sequence[str]) -> pl.DataFrame:
    """Bus bandwidth by message size for the given nccl-tests runs: ``run_id, ts, op, size_bytes,
    in_place, time_s, algbw_gbps, busbw_gbps``."""
    cols = ("run_id", "ts", "op", "size_bytes", "in_place", "time_s", "algbw_gbps", "busbw_gbps")
    schema = {c: F.NCCL_TEST.schema[c] for c in cols}
    if not run_ids:
        return pl.DataFrame(schema=schema)
    sql = f"SELECT {', '.join(cols)} FROM nccl_test WHERE run_id IN ({', '.join('?' for _ in run_ids)}) ORDER BY run_id, size_bytes, in_place"
    return fetch(store, sql, list(run_ids), schema)


def collective_busbw(
    store: Store, start: dt.datetime, end: dt.datetime, job_id: str | None = None, max_jobs: int = 50
) -> pl.DataFrame:
    """NCCL bus bandwidth by operation and message size in the window: ``op, bytes, calls,
    busbw_mean_gbps, busbw_min_gbps, busbw_max_gbps, duration_mean_s``.

    Reads one job's collectives, or those of the ``max_jobs`` most recent jobs in the window, through the
    ``(job_id, start)`` index; never the whole table.
    """
    schema = {
        "op": pl.String,
        "bytes": pl.Int64,
        "calls": pl.Int64,
        "busbw_mean_gbps": pl.Float64,
        "busbw_min_gbps": pl.Float64,
        "busbw_max_gbps": pl.Float64,
        "duration_mean_s": pl.Float64,
    }
    params: list[Any] = []
    if job_id is not None:
        job_sql = "job_id = ?"
        params.append(job_id)
    else:
        recent = jobs(store, start, end, limit=max_jobs)["job_id"].to_list()
        if not recent:
            return pl.DataFrame(schema=schema)
        job_sql = f"job_id IN ({', '.join('?' for _ in recent)})"
        params += recent
    params += [as_utc(start), as_utc(end)]
    sql = (
        "SELECT op, bytes, COUNT(*) AS calls, AVG(busbw_gbps) AS busbw_mean_gbps, MIN(busbw_gbps) AS busbw_min_gbps,"
        " MAX(busbw_gbps) AS busbw_max_gbps, AVG(duration_s) AS duration_mean_s FROM collective"
        f' WHERE {job_sql} AND "start" >= ? AND "start" < ? AND peer = -1 AND bytes > 0 GROUP BY op, bytes ORDER BY op, bytes'
    )
    return fetch(store, sql, params, schema)


IB_FINDING_KINDS = ("ib_link_flapping", "ib_link_errors", "ib_link_degraded", "ib_congestion")
FABRIC_TOPOLOGY_KINDS = ("comm_straggler_fabric", "alltoall_low_utilization")
_FINDING_ROWS = {"kind": pl.String, "subject": pl.String, "severity": pl.String, "score": pl.Float64, "window_end": UTC, "summary": pl.String}


def _fabric_findings(store: Store, kinds: tuple[str, ...], start: dt.datetime, end: dt.datetime, limit: int) -> pl.DataFrame:
    """The fabric analyzer's findings of ``kinds`` for windows ending in [start, end), newest first."""
    marks = ", ".join("?" for _ in kinds)
    sql = ("SELECT kind, subject, severity, score, window_end, summary FROM finding"
           f" WHERE analyzer = 'fabric' AND kind IN ({marks}) AND window_end >= ? AND window_end < ?"
           f" ORDER BY window_end DESC LIMIT {int(limit)}")
    return fetch(store, sql, [*kinds, as_utc(start), as_utc(end)], _FINDING_ROWS)


def fabric_link_findings(store: Store, start: dt.datetime, end: dt.datetime, limit: int = 500) -> pl.DataFrame:
    """The InfiniBand link findings the health sweep stored for windows ending in [start, end), newest
    first: ``kind, subject, severity, score, window_end, summary``."""
    return _fabric_findings(store, IB_FINDING_KINDS, start, end, limit)


def fabric_topology_findings(store: Store, start: dt.datetime, end: dt.datetime, limit: int = 500) -> pl.DataFrame:
    """The health sweep's findings against the topology for windows ending in [start, end), newest first:
    the port or switch a job's slow ranks share (``comm_straggler_fabric``) and all-to-all runs far below
    the topology's bound (``alltoall_low_utilization``). Columns ``kind, subject, severity, score,
    window_end, summary``."""
    return _fabric_findings(store, FABRIC_TOPOLOGY_KINDS, start, end, limit)


def fabric_nic_rate_gbps(store: Store) -> pl.DataFrame:
    """The usual HCA link rate in the stored topology (``analyzers.ib_links.nic_link_rate_gbps``), as one
    row ``rate_gbps, links`` (null rate when no topology is stored)."""
    rows = fetch(store, "SELECT a_kind, rate_gbps, connected FROM fabric_link WHERE a_kind = 'CA'", [],
                  {"a_kind": pl.String, "rate_gbps": pl.Float64, "connected": pl.Boolean})
    return pl.DataFrame({"rate_gbps": [ib_links.nic_link_rate_gbps(rows)], "links": [rows.filter(pl.col("connected").fill_null(False)).height]},
                        schema={"rate_gbps": pl.Float64, "links": pl.Int64})
