"""Stranded capacity: free GPUs that no pending job can use, because of how the free GPUs are spread over
nodes (fragmentation) — a node with 3 free GPUs while every job in the queue asks for 8 per node, or free GPUs
on a node whose CPUs are all taken. The stranded share of free capacity is the fragmentation measure of
Weng et al., "Beware of Fragmentation: Scheduling GPU-Sharing Workloads with Fragmentation Gradient
Descent", USENIX ATC 2023 (§2.2: GPUs unusable by the target workload), with the pending queue as the workload.

Per partition (``sched_node.partitions``): the free GPUs and CPUs of each schedulable node (its base state
IDLE, MIXED, ALLOCATED or COMPLETING with no DRAIN, DOWN, FAIL, MAINT, RESERVED, NOT_RESPONDING or power-down
flag: a drained node's GPUs are unavailable, not stranded) against each pending job's request per node
(``sched_job``, state PENDING): ``gpus`` over its node count (1 where the source does not say; a request
larger than the partition's biggest node is spread over as few nodes as can hold it, as Slurm places
``--gpus`` jobs) and its CPUs likewise. A node's free GPUs are usable if some pending job fits on it (GPUs
and CPUs per node) and enough nodes of the partition fit that job; the free GPUs of a node no pending job
can use are stranded. A partition with no pending GPU job strands nothing: its free GPUs are idle capacity,
waiting for work rather than shut out of it.

Free GPUs are ``gpus_total - gpus_alloc`` from the node's record; where the record has no allocation, the
GPUs the running jobs hold on it (``sched_job_node``).

Pure: frames in, frames out.
"""

from __future__ import annotations

import datetime as dt
import json

import polars as pl

from fleetscope.core.frames import findings_frame
from fleetscope.core.spec import require_columns

ANALYZER = "stranded_capacity"
KIND = "stranded_capacity"
SCHEDULABLE = ("IDLE", "MIXED", "ALLOCATED", "COMPLETING")
UNAVAILABLE_FLAGS = ("DRAIN", "DRAINING", "DRAINED", "DOWN", "FAIL", "FAILING", "MAINT", "RESERVED", "NOT_RESPONDING", "POWERED_DOWN",
                     "POWERING_DOWN", "POWER_DOWN", "POWERING_UP", "REBOOT_REQUESTED", "REBOOT_ISSUED", "INVALID_REG", "FUTURE", "UNKNOWN")

NODE_SCHEMA = {"cluster": pl.String, "partition": pl.String, "host": pl.String, "free_gpus": pl.Int64, "free_cpus": pl.Int64, "gpu_types": pl.String,
               "usable": pl.Boolean}
SUMMARY_SCHEMA = {"cluster": pl.String, "partition": pl.String, "pending_jobs": pl.Int64, "min_gpus_per_node": pl.Int64, "nodes_with_free_gpus": pl.Int64,
                  "free_gpus": pl.Int64, "stranded_nodes": pl.Int64, "stranded_gpus": pl.Int64}


def free_nodes(nodes: pl.DataFrame, job_nodes: pl.DataFrame | None = None) -> pl.DataFrame:
    """Per (cluster, partition, host) of a schedulable node with free GPUs: ``free_gpus``, ``free_cpus``
    (null where unknown) and ``gpu_types``."""
    require_columns(nodes, "sched_node", ("cluster", "host", "state", "gpus_total", "gpus_alloc", "partitions"))
    n = nodes.filter(pl.col("gpus_total").fill_null(0) > 0)
    if job_nodes is not None and job_nodes.height:
        held = job_nodes.group_by("cluster", "host").agg(pl.col("gpus").sum().alias("_held"))
        n = n.join(held, on=["cluster", "host"], how="left")
    else:
        n = n.with_columns(pl.lit(None, pl.Int64).alias("_held"))
    flags = pl.col("state").fill_null("UNKNOWN").str.to_uppercase().str.split("+")
    ok = flags.list.first().is_in(list(SCHEDULABLE)) & ~flags.list.eval(pl.element().is_in(list(UNAVAILABLE_FLAGS))).list.any()
    cpus = [c for c in ("cpus_total", "cpus_alloc") if c not in n.columns]
    n = n.with_columns([pl.lit(None, pl.Int64).alias(c) for c in cpus])
    if "gpu_types" not in n.columns:
        n = n.with_columns(pl.lit(None, pl.String).alias("gpu_types"))
    return (n.filter(ok)
            .with_columns((pl.col("gpus_total") - pl.coalesce("gpus_alloc", "_held", pl.lit(0))).clip(0).alias("free_gpus"),
                          (pl.col("cpus_total") - pl.col("cpus_alloc").fill_null(0)).clip(0).alias("free_cpus"),
                          pl.col("partitions").fill_null("").str.split(",").alias("partition"))
            .explode("partition").filter(pl.col("partition") != "").filter(pl.col("free_gpus") > 0)
            .select(pl.col("cluster").fill_null(""), "partition", "host", "free_gpus", "free_cpus", "gpu_types"))


def pending_shapes(jobs: pl.DataFrame, nodes: pl.DataFrame) -> pl.DataFrame:
    """Per (cluster, partition, GPUs per node, CPUs per node, nodes) the pending GPU jobs asking for it.
    ``nodes`` (``sched_node``) gives each partition's biggest node, over which a request too large for one
    node is spread."""
    require_columns(jobs, "sched_job", ("cluster", "job_id", "state", "partition", "gpus"))
    biggest = (nodes.filter(pl.col("gpus_total").fill_null(0) > 0)
               .with_columns(pl.col("partitions").fill_null("").str.split(",").alias("partition")).explode("partition")
               .group_by(pl.col("cluster").fill_null(""), "partition").agg(pl.col("gpus_total").max().alias("_biggest")))
    opt = [c for c in ("node_count", "cpus") if c not in jobs.columns]
    j = (jobs.with_columns([pl.lit(None, pl.Int64).alias(c) for c in opt])
         .filter((pl.col("state") == "PENDING") & (pl.col("gpus").fill_null(0) > 0) & pl.col("partition").is_not_null())
         .with_columns(pl.col("cluster").fill_null(""), pl.col("partition").str.split(",")).explode("partition")
         .join(biggest, on=["cluster", "partition"], how="left"))
    asked = pl.col("node_count").fill_null(1).clip(1)
    spread = (pl.col("gpus") / asked).ceil() > pl.col("_biggest")
    k = pl.when(spread).then((pl.col("gpus") / pl.col("_biggest")).ceil()).otherwise(asked).cast(pl.Int64)
    return (j.with_columns(k.alias("nodes"))
            .with_columns((pl.col("gpus") / pl.col("nodes")).ceil().cast(pl.Int64).alias("gpus_per_node"),
                          (pl.col("cpus").fill_null(1) / pl.col("nodes")).ceil().cast(pl.Int64).clip(1).alias("cpus_per_node"))
            .group_by("cluster", "partition", "gpus_per_node", "cpus_per_node", "nodes").agg(pl.len().alias("jobs")))


def stranded(nodes: pl.DataFrame, jobs: pl.DataFrame, job_nodes: pl.DataFrame | None = None) -> tuple[pl.DataFrame, pl.DataFrame]:
    """(per node and partition: free GPUs and whether a pending job can use them; per partition with pending GPU
    jobs: free and stranded GPUs)."""
    free = free_nodes(nodes, job_nodes)
    shapes = pending_shapes(jobs, nodes)
    if not free.height or not shapes.height:
        return pl.DataFrame(schema=NODE_SCHEMA), pl.DataFrame(schema=SUMMARY_SCHEMA)
    free = free.join(shapes.select("cluster", "partition").unique(), on=["cluster", "partition"])  # partitions with a queue
    fits = (free.join(shapes, on=["cluster", "partition"])
            .filter((pl.col("free_gpus") >= pl.col("gpus_per_node")) & (pl.col("free_cpus").is_null() | (pl.col("free_cpus") >= pl.col("cpus_per_node")))))
    # a job placeable only if enough nodes fit it: the nodes of jobs too wide for the partition's free nodes are no use to them
    placeable = fits.with_columns(pl.len().over("cluster", "partition", "gpus_per_node", "cpus_per_node", "nodes").alias("_fit")).filter(
        pl.col("_fit") >= pl.col("nodes"))
    usable = placeable.select("cluster", "partition", "host").unique().with_columns(pl.lit(True).alias("usable"))
    per_node = (free.join(usable, on=["cluster", "partition", "host"], how="left").with_columns(pl.col("usable").fill_null(False))
                .select(list(NODE_SCHEMA)).sort("cluster", "partition", "host"))
    summary = (per_node.group_by("cluster", "partition").agg(
        pl.len().alias("nodes_with_free_gpus"), pl.col("free_gpus").sum(),
        (~pl.col("usable")).sum().cast(pl.Int64).alias("stranded_nodes"), pl.col("free_gpus").filter(~pl.col("usable")).sum().alias("stranded_gpus"))
        .join(shapes.group_by("cluster", "partition").agg(pl.col("jobs").sum().alias("pending_jobs"), pl.col("gpus_per_node").min().alias("min_gpus_per_node")),
              on=["cluster", "partition"])
        .select([pl.col(c).cast(t) for c, t in SUMMARY_SCHEMA.items()]).sort("cluster", "partition"))
    return per_node, summary


def stranded_findings(per_node: pl.DataFrame, summary: pl.DataFrame, *, since: dt.datetime, now: dt.datetime,
                      prices: dict[str, tuple[float, str]] | None = None) -> pl.DataFrame:
    """One warning per partition with stranded GPUs: how many, on which nodes, and what they cost per hour
    (``prices``: host → its GPU-hour price and currency, from the price book). The finding's window starts at
    ``since``, the node snapshot it rests on, so sweeps over one snapshot update a finding, never add one."""
    rows = []
    for s in summary.filter(pl.col("stranded_gpus") > 0).iter_rows(named=True):
        nodes = per_node.filter((pl.col("cluster") == s["cluster"]) & (pl.col("partition") == s["partition"]) & ~pl.col("usable"))
        ev: dict[str, object] = {**s, "nodes": {r["host"]: r["free_gpus"] for r in nodes.iter_rows(named=True)}}
        priced = [(r["free_gpus"] * prices[r["host"]][0], prices[r["host"]][1]) for r in nodes.iter_rows(named=True) if prices and r["host"] in prices]
        currencies = sorted({c for _, c in priced})
        cost = ""
        if priced and len(currencies) == 1:
            ev["cost_per_hour"], ev["currency"] = round(sum(p for p, _ in priced), 4), currencies[0]
            ev["priced_gpus"] = int(sum(r["free_gpus"] for r in nodes.iter_rows(named=True) if r["host"] in (prices or {})))
            cost = f", {ev['cost_per_hour']:,.2f} {ev['currency']}/h"
        where = f"{s['cluster']}/{s['partition']}" if s["cluster"] else s["partition"]
        subject = (f"cluster:{s['cluster']}/" if s["cluster"] else "") + f"partition:{s['partition']}"
        rows.append({"analyzer": ANALYZER, "kind": KIND, "subject": subject, "window_start": min(since, now), "window_end": now, "severity": "warning",
                     "score": float(s["stranded_gpus"]),
                     "summary": f"partition {where}: {s['stranded_gpus']} of {s['free_gpus']} free GPUs on {s['stranded_nodes']} node(s) fit none of "
                                f"its {s['pending_jobs']} pending GPU job(s) (smallest ask {s['min_gpus_per_node']} GPUs per node){cost}",
                     "evidence": json.dumps(ev, default=str)})
    return findings_frame(rows)
