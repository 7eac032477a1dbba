"""GPU health, fabric and known-answer probes against the store: windows of telemetry in, findings out.

Pure analysis lives in ``analyzers/health.py``, ``analyzers/fabric.py``, ``analyzers/ib_links.py`` and
``analyzers/sdc.py``; this module
reads bounded windows, writes findings and probe results, and owns the clock. The reads of what it wrote
(the dashboard's, the API's and the CLI's) are ``fleetscope.services.health_reads``.
"""

from __future__ import annotations

import datetime as dt
import socket
from dataclasses import dataclass, field
from typing import Any

import polars as pl

from sqlalchemy import select

from analyzers import absence, fabric, fabric_attribution, hangs, health, ib_links, idle_allocations, sdc, sdc_probe
# the probe's health event and its reading back (the agent sends the same event): the pure floor's, named here too
from analyzers.sdc_probe import probe_event, probe_results
from fleetscope.core import frames as F
from fleetscope.devices import probe
from fleetscope.store import schema
from fleetscope.observability import tracer
from fleetscope.services import shards
from fleetscope.services import scheduler_capacity, team_costs
from fleetscope.services.analysis import Registry
from fleetscope.store import Store
from fleetscope.store.reads import gpu_samples_sql

MAX_WINDOW = dt.timedelta(days=1)


# dcgm-exporter's NVLink error counters (default-counters.csv) have no gpu_sample column: the dcgm parser
# keeps them in metric_sample as FIELD{gpu_uuid="..."}.
NVLINK_FIELDS = {
    "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL": "nvlink_crc_flit_errors_total",
    "DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL": "nvlink_crc_data_errors_total",
    "DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL": "nvlink_replay_errors_total",
    "DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL": "nvlink_recovery_errors_total",
}


def with_nvlink_counters(store: Store, samples: pl.DataFrame, start: dt.datetime, end: dt.datetime) -> pl.DataFrame:
    """``samples`` with the NVLink error counters of the same scrapes as columns (``analyzers.health``
    names), where the window holds any; unchanged otherwise."""
    if samples.height == 0:
        return samples
    rows = store.query(
        "SELECT s.name, s.series, m.ts, m.value FROM metric_sample m JOIN series s ON s.series_id = m.series_id "
        f"WHERE s.name IN ({', '.join('?' for _ in NVLINK_FIELDS)}) AND m.ts >= ? AND m.ts < ?",
        [*NVLINK_FIELDS, start, end], {"name": pl.String, "series": pl.String, "ts": F.UTC_US, "value": pl.Float64})
    if rows.height == 0:
        return samples
    wide = (rows.with_columns(pl.col("series").str.extract(r'gpu_uuid="([^"]*)"').alias("gpu_uuid"),
                              pl.col("name").replace_strict(NVLINK_FIELDS).alias("field"))
            .drop_nulls("gpu_uuid")
            .pivot("field", index=["gpu_uuid", "ts"], values="value", aggregate_function="first"))
    return samples.join(wide, on=["gpu_uuid", "ts"], how="left", maintain_order="left")


Part = None | str | tuple[int, int]
"""Which part of a split sweep a run is: None (all of it), ``"fleet"`` or ``(shard, shards)``."""


def fleet_loaded_clock_p90(store: Store, start: dt.datetime, end: dt.datetime) -> float | None:
    """``analyzers.health.loaded_clock_p90`` over the whole fleet's samples in [start, end), reading only the
    two columns it needs: what a shard's GPUs are held to."""
    source = gpu_samples_sql(store, start, end, ("util_ratio", "sm_clock_mhz"))
    df = store.query(f"SELECT util_ratio, sm_clock_mhz FROM {source} WHERE util_ratio >= 0.5",
                     [], {"util_ratio": pl.Float64, "sm_clock_mhz": pl.Float64})
    return health.loaded_clock_p90(df)


@dataclass
class WindowRun:
    """One health sweep over [start, end): the window's frames (each read once) and the findings so far.
    ``shared`` carries what one analysis leaves for a later one (the topology, the fresh link findings)."""

    store: Store
    start: dt.datetime
    end: dt.datetime
    hang_min_stall_s: float
    part: Part = None
    idle_min_s: float = idle_allocations.MIN_IDLE_S
    found: list[pl.DataFrame] = field(default_factory=list)
    shared: dict[str, Any] = field(default_factory=dict)
    gpu_rows: pl.DataFrame = field(default_factory=pl.DataFrame)
    node_rows: pl.DataFrame = field(default_factory=pl.DataFrame)
    _frames: dict[str, pl.DataFrame] = field(default_factory=dict)

    def read(self, frame: str) -> pl.DataFrame:
        if frame not in self._frames:
            if frame == "gpu_sample" and self.part == "fleet":
                # the fleet's analyses read when each GPU reported, not what it reported
                df = self.store.read("gpu_sample", start=self.start, end=self.end, columns=["ts", "gpu_uuid"])
            elif frame == "gpu_sample" and isinstance(self.part, tuple):
                df = with_nvlink_counters(self.store, shards.shard_gpu_samples(self.store, *self.part, self.start, self.end, list(F.GPU_SAMPLE.names), dict(F.GPU_SAMPLE.schema)), self.start, self.end)
            elif frame == "gpu_sample":
                df = with_nvlink_counters(self.store, self.store.read("gpu_sample", start=self.start, end=self.end), self.start, self.end)
            elif frame == "health_event" and isinstance(self.part, tuple):
                df = shards.in_shard(self.store, self.store.read("health_event", start=self.start, end=self.end), *self.part)
            elif frame == "health_event":
                df = self.store.read("health_event", start=self.start, end=self.end)
            elif frame == "gpu":
                df = self.store.read("gpu", columns=["gpu_uuid", "host", "model_name"])
            else:  # nccl_test: the whole history, its runs are compared with their peers of any age
                df = self.store.read(frame)
            self._frames[frame] = df
        return self._frames[frame]


WINDOW: Registry[WindowRun] = Registry("window")
"""The per-window analyses of the health sweep, in the order they run (``services.analysis``)."""


@WINDOW.register("gpu_health", modules=("analyzers.health",), reads=("gpu_sample", "metric_sample", "health_event", "gpu"),
                 writes=("finding",), needs=("gpu_sample",), sharded=True,
                 summary="per-GPU and per-node health (ECC, row remap, XIDs, PCIe replay, NVLink errors) and thermal throttling")
def _gpu_health(w: WindowRun) -> None:
    events, gpus = w.read("health_event"), w.read("gpu")
    # a shard's GPUs are held to the clock the whole fleet's loaded GPUs hold, as in one sweep
    expected = fleet_loaded_clock_p90(w.store, w.start, w.end) if isinstance(w.part, tuple) else None
    w.gpu_rows = health.gpu_health(w.read("gpu_sample"), events.filter(pl.col("kind") == "xid") if events.height else None,
                                   gpu_host=gpus if gpus.height else None, expected_sm_clock_mhz=expected,
                                   expectation_given=isinstance(w.part, tuple))
    w.node_rows = health.node_health(w.gpu_rows) if "host" in w.gpu_rows.columns else pl.DataFrame()
    w.found.append(health.health_findings(w.gpu_rows, w.node_rows if w.node_rows.height else None, window_start=w.start, window_end=w.end))
    w.found.append(health.throttle_findings(w.gpu_rows, window_start=w.start, window_end=w.end))


@WINDOW.register("absence", modules=("analyzers.absence",), reads=("gpu_sample", "gpu", "host", "finding"), writes=("finding",),
                 summary="GPUs, hosts and sites that stopped reporting, carried until they report again")
def _absence(w: WindowRun) -> None:
    w.found.append(absent(w.store, w.read("gpu_sample"), w.read("gpu"), w.start, w.end))


@WINDOW.register("hangs", modules=("analyzers.hangs",), reads=("step", "job_rank", "gpu_sample", "health_event"), writes=("finding",),
                 summary="jobs that stopped stepping while holding their GPUs, and NCCL watchdog timeouts")
def _hangs(w: WindowRun) -> None:
    samples = w.read("gpu_sample")
    # stalls are measured against the freshest telemetry, as absence is: a hung job's GPUs keep
    # reporting (busy in the collective), while data that arrives late moves every clock together
    fresh = min(w.end, samples["ts"].max()) if samples.height else w.end
    w.found.append(hangs.hang_findings(job_progress(w.store, fresh), now=fresh, min_stall_s=w.hang_min_stall_s,
                                       watchdog=watchdog_timeouts(w.store, fresh)))


@WINDOW.register("sdc_probe", modules=("analyzers.sdc",), reads=("health_event",), writes=("finding",),
                 summary="GPUs that failed the known-answer probe: confirmed silent-data-corruption suspects")
def _sdc_probe(w: WindowRun) -> None:
    probes = probe_results(w.read("health_event"))
    if probes.height:
        w.found.append(sdc.sdc_findings(probes=probes))


@WINDOW.register("nccl_tests", modules=("analyzers.fabric",), reads=("nccl_test",), writes=("finding",), needs=("nccl_test",),
                 summary="nccl-tests runs whose bus bandwidth regressed against earlier runs of the same shape")
def _nccl_tests(w: WindowRun) -> None:
    reg = fabric.nccl_test_regressions(w.read("nccl_test"))
    if reg.height:
        w.found.append(fabric.fabric_findings(regressions=reg, window_start=w.start, window_end=w.end))


@WINDOW.register("ib_links", modules=("analyzers.ib_links",), reads=("fabric_port_sample", "fabric_link"), writes=("finding",),
                 summary="InfiniBand/RoCE links flapping, erroring, congested or trained narrower or slower than their peers")
def _ib_links(w: WindowRun) -> None:
    fh = fabric_health(w.store, w.start, w.end)
    w.shared.update(topology=fh["topology"], nic_rate_gbps=fh["nic_rate_gbps"], link_findings=fh["findings"])
    w.found.append(fh["findings"])


@WINDOW.register("alltoall", modules=("analyzers.fabric_attribution",), reads=("nccl_test", "fabric_link"), writes=("finding",),
                 summary="all-to-all runs far below the bound the stored topology allows")
def _alltoall(w: WindowRun) -> None:
    util = alltoall_utilization(w.store, w.end, w.read("nccl_test"), links=w.shared.get("topology"), nic_rate_gbps=w.shared.get("nic_rate_gbps"))
    w.found.append(fabric_attribution.utilization_findings(util))


@WINDOW.register("slow_fabric", modules=("analyzers.fabric",), reads=("collective", "nccl_test"), writes=("finding",),
                 summary="hosts and point-to-point links slower than their peers in collectives and nccl-tests")
def _slow_fabric(w: WindowRun) -> None:
    slow = slow_fabric(w.store, w.start, w.end, w.read("nccl_test"))
    w.shared["slow"] = slow
    w.found.append(slow)


@WINDOW.register("fabric_attribution", modules=("analyzers.fabric_attribution",),
                 reads=("finding", "job_rank", "gpu", "fabric_gpu_nic", "fabric_link"), writes=("finding",),
                 summary="the HCA port, host or leaf switch a job's communication stragglers share")
def _fabric_attribution(w: WindowRun) -> None:
    fresh = pl.concat([w.shared.get("link_findings", F.FINDING.empty()), w.shared.get("slow", F.FINDING.empty())], how="vertical_relaxed")
    w.found.append(straggler_attribution(w.store, w.start, w.end, links=w.shared.get("topology"), fresh=fresh)["findings"])


@WINDOW.register("idle_allocations", modules=("analyzers.idle_allocations",), reads=("sched_job", "sched_job_node", "gpu", "gpu_sample", "price_book"),
                 writes=("finding",), summary="GPUs a scheduler job or pod holds while near-idle past a threshold, with their cost")
def _idle_allocations(w: WindowRun) -> None:
    w.found.append(scheduler_capacity.idle_allocation_findings(w.store, end=w.end, min_idle_s=w.idle_min_s))


@WINDOW.register("team_budgets", modules=("analyzers.team_budgets", "analyzers.chargeback"),
                 reads=("team_budget", "sched_job", "sched_job_node", "gpu_sample", "price_book"), writes=("finding",),
                 summary="teams over, or on course to exceed, their monthly GPU-hour quota or money budget")
def _team_budgets(w: WindowRun) -> None:
    if w.store.read("team_budget", limit=1).height:  # the month's usage is read only where some team has a budget
        w.found.append(team_costs.budget_findings(w.store, now=w.end))


@WINDOW.register("stranded_capacity", modules=("analyzers.stranded",), reads=("sched_node", "sched_job", "sched_job_node", "price_book"),
                 writes=("finding",), summary="free GPUs no pending job can use because of how they are spread over nodes, with their cost per hour")
def _stranded_capacity(w: WindowRun) -> None:
    if w.store.read("sched_node", limit=1).height:
        w.found.append(scheduler_capacity.stranded_capacity(w.store, now=w.end)["findings"])


def health_window(store: Store, start: dt.datetime, end: dt.datetime, *, write: bool = True, hang_min_stall_s: float = 300.0,
                  part: Part = None, idle_min_s: float = idle_allocations.MIN_IDLE_S) -> dict[str, Any]:
    """Per-GPU and per-node health over [start, end), with fabric regressions; findings stored when ``write``.
    Every analysis of the ``WINDOW`` registry runs in turn.

    ``part`` splits the sweep across workers (``FLEETSCOPE_SWEEP_SHARDS``): ``(shard, shards)`` runs the sharded
    analyses over the GPUs of that shard's hosts (``services.shards``), ``"fleet"`` the others once; the
    parts together find what one sweep finds."""
    if end <= start:
        raise ValueError("end must be after start")
    if end - start > MAX_WINDOW:
        raise ValueError(f"window longer than {MAX_WINDOW}: health reads raw samples, so ask for at most a day")
    if part is not None and part != "fleet" and not (isinstance(part, tuple) and len(part) == 2 and 0 <= part[0] < part[1]):
        raise ValueError(f"part must be None, 'fleet' or (shard, shards) with 0 <= shard < shards, not {part!r}")
    with tracer().start_as_current_span("health.window"):
        w = WindowRun(store, start, end, hang_min_stall_s, part, idle_min_s)
        only = None if part is None else (lambda a: a.sharded) if isinstance(part, tuple) else (lambda a: not a.sharded)
        # an empty window is a finding of its own (absence), never a note
        WINDOW.run_all(w, lambda frame: w.read(frame).height > 0, lambda _note: None, only)
        parts = [f for f in w.found if f.height]
        found = pl.concat(parts, how="vertical_relaxed") if parts else F.FINDING.empty()
        if write and found.height:
            store.write(F.Batch(source=f"health:{start.isoformat()}", finding=found))
        return {"gpus": w.gpu_rows, "nodes": w.node_rows, "findings": found}


NCCL_TEST_LOOKBACK = dt.timedelta(days=1)
"""nccl-tests runs compared for slow hosts: a day of health checks, enough runs of each shape to have peers."""
_COLLECTIVE_COLUMNS = ["job_id", "rank", "comm_id", "seq", "op", "peer", "bytes", "busbw_gbps", "host"]


def slow_fabric(store: Store, start: dt.datetime, end: dt.datetime, nccl_test: pl.DataFrame | None = None) -> pl.DataFrame:
    """``slow_host`` and ``slow_link`` findings (``analyzers.fabric``): hosts whose collective groups — the
    window's NCCL collectives, grouped per instance, and the last day's nccl-tests runs — move data slower
    than peer groups of the same shape, and point-to-point pairs slower than the job's median pair."""
    coll = store.read("collective", start=start, end=end, columns=_COLLECTIVE_COLUMNS)
    out: list[pl.DataFrame] = []
    if coll.height:
        with_host = coll.filter(pl.col("host").is_not_null())
        if with_host.height:
            members = fabric.slow_members(fabric.collective_groups(with_host, member="host"))
            out.append(fabric.fabric_findings(members=members, member_kind="host", window_start=start, window_end=end))
        if coll.filter(pl.col("peer") >= 0).height:
            out.append(fabric.fabric_findings(links=fabric.slow_links(coll), window_start=start, window_end=end))
    tests = nccl_test if nccl_test is not None else store.read("nccl_test")
    if tests.height and "hosts" in tests.columns:
        recent = tests.filter(pl.col("ts").is_not_null() & (pl.col("ts") >= end - NCCL_TEST_LOOKBACK) & (pl.col("ts") < end)
                              & pl.col("hosts").is_not_null())
        if recent.height:
            out.append(fabric.fabric_findings(members=fabric.slow_members(fabric.nccl_test_groups(recent)), member_kind="host",
                                              window_start=start, window_end=end))
    out = [f for f in out if f.height]
    # the same host slow in collectives and in nccl-tests is one finding (the finding frame's key)
    return pl.concat(out, how="vertical_relaxed").unique(["analyzer", "kind", "subject", "window_start"], keep="first") if out else F.FINDING.empty()


def alltoall_utilization(store: Store, end: dt.datetime, nccl_test: pl.DataFrame | None = None, *, start: dt.datetime | None = None,
                         links: pl.DataFrame | None = None, nic_rate_gbps: float | None = None) -> pl.DataFrame:
    """nccl-tests all-to-all runs in [start, end) (default: the ``NCCL_TEST_LOOKBACK`` before ``end``)
    against the all-to-all bound the stored topology implies (``analyzers.fabric_attribution``)."""
    start = start or end - NCCL_TEST_LOOKBACK
    tests = nccl_test if nccl_test is not None else store.read("nccl_test")
    if tests.height == 0 or "hosts" not in tests.columns:
        return pl.DataFrame(schema=fabric_attribution.UTILIZATION_SCHEMA)
    recent = tests.filter(pl.col("ts").is_not_null() & (pl.col("ts") >= start) & (pl.col("ts") < end))
    if recent.height == 0:
        return pl.DataFrame(schema=fabric_attribution.UTILIZATION_SCHEMA)
    links = store.read("fabric_link") if links is None else links
    if nic_rate_gbps is None and links.height:
        nic_rate_gbps = ib_links.nic_link_rate_gbps(links)
    return fabric_attribution.alltoall_utilization(recent, links if links.height else None, nic_rate_gbps=nic_rate_gbps)


ATTRIBUTION_LOOKBACK = dt.timedelta(hours=1)
"""How far back a sweep looks for communication stragglers and unhealthy links to join: the job analyses
run every minute over the job's whole record, so an hour holds the current ones."""
_COMM_SLOW = ("straggler_communication_slow",)
_IB_KINDS = ("ib_link_flapping", "ib_link_errors", "ib_congestion", "ib_link_degraded")


def _slow_ranks(stored: pl.DataFrame, fresh: pl.DataFrame, held: pl.DataFrame) -> pl.DataFrame:
    """job_id, rank, kind of each rank marked slow: communication stragglers (job:J/rank:R), slow
    point-to-point links (job:J/link:R->P, both ends) and the ranks of slow hosts (host:H)."""
    parts = [pl.DataFrame(schema={"job_id": pl.String, "rank": pl.Int64, "kind": pl.String})]
    both = pl.concat([stored.select("kind", "subject"), fresh.select("kind", "subject")]) if fresh.height else stored.select("kind", "subject")
    st = both.filter(pl.col("kind").is_in(_COMM_SLOW)).with_columns(pl.col("subject").str.extract_groups(r"^job:(.+)/rank:(\d+)$").alias("g"))
    parts.append(st.select(pl.col("g").struct.field("1").alias("job_id"), pl.col("g").struct.field("2").cast(pl.Int64, strict=False).alias("rank"), "kind"))
    ln = both.filter(pl.col("kind") == "slow_link").with_columns(pl.col("subject").str.extract_groups(r"^job:(.+)/link:(\d+)->(\d+)$").alias("g"))
    for end in ("2", "3"):
        parts.append(ln.select(pl.col("g").struct.field("1").alias("job_id"), pl.col("g").struct.field(end).cast(pl.Int64, strict=False).alias("rank"), "kind"))
    hosts = both.filter(pl.col("kind") == "slow_host").select(pl.col("subject").str.strip_prefix("host:").alias("host"), "kind")
    if hosts.height and held.height:
        parts.append(hosts.join(held.select("job_id", "rank", "host"), on="host").select("job_id", "rank", "kind"))
    return pl.concat(parts).drop_nulls().unique().sort("job_id", "rank", "kind")


def straggler_attribution(store: Store, start: dt.datetime, end: dt.datetime, *, links: pl.DataFrame | None = None,
                          fresh: pl.DataFrame | None = None, job_id: str | None = None) -> dict[str, Any]:
    """Which port, host or leaf switch each job's slow-communicating ranks share
    (``analyzers.fabric_attribution``): the communication stragglers, slow links and slow hosts found
    over ``ATTRIBUTION_LOOKBACK`` before ``end`` (stored, plus ``fresh`` findings of this sweep), the
    ranks' placement through ``job_rank``, ``gpu``, ``fabric_gpu_nic`` and ``fabric_link``, and the
    unhealthy InfiniBand links found meanwhile. Returns the per-component table and the findings."""
    since = start - ATTRIBUTION_LOOKBACK
    kinds = (*_COMM_SLOW, "slow_link", "slow_host", *_IB_KINDS)
    marks = ", ".join("?" for _ in kinds)
    stored = store.query(f"SELECT kind, subject, summary FROM finding WHERE kind IN ({marks}) AND window_end >= ? AND window_start < ?",
                         [*kinds, since, end], {"kind": pl.String, "subject": pl.String, "summary": pl.String})
    fresh = fresh if fresh is not None and fresh.height else pl.DataFrame(schema={"kind": pl.String, "subject": pl.String, "summary": pl.String})
    fresh = fresh.select("kind", "subject", "summary")
    held = store.query('SELECT job_id, rank, host, gpu_uuid FROM job_rank WHERE "start" < ? AND ("end" IS NULL OR "end" >= ?)', [end, since],
                       {"job_id": pl.String, "rank": pl.Int64, "host": pl.String, "gpu_uuid": pl.String})
    if job_id is not None:
        held = held.filter(pl.col("job_id") == job_id)
    empty = {"attribution": pl.DataFrame(schema=fabric_attribution.ATTRIBUTION_SCHEMA), "findings": F.FINDING.empty(),
             "slow": pl.DataFrame(schema={"job_id": pl.String, "rank": pl.Int64, "kind": pl.String})}
    slow = _slow_ranks(stored, fresh, held)
    if job_id is not None:
        slow = slow.filter(pl.col("job_id") == job_id)
    if slow.height == 0 or held.height == 0:
        return {**empty, "slow": slow}
    held = held.join(slow.select("job_id").unique(), on="job_id", how="semi")
    gpus = store.read("gpu", columns=["gpu_uuid", "host", "pci_bus_id", "gpu_index"])
    if gpus.height:  # a rank row may name only its GPU
        held = held.join(gpus.select("gpu_uuid", pl.col("host").alias("_gpu_host")), on="gpu_uuid", how="left").with_columns(
            pl.coalesce("host", "_gpu_host").alias("host")).drop("_gpu_host")
    links = store.read("fabric_link") if links is None else links
    ports = fabric_attribution.host_ports(links) if links.height else pl.DataFrame(schema=fabric_attribution.PORTS_SCHEMA)
    ib = pl.concat([stored, fresh]).filter(pl.col("kind").is_in(_IB_KINDS)).unique(["kind", "subject"])
    unhealthy = fabric_attribution.unhealthy_components(ib, ports)
    extra = unhealthy.filter(pl.col("level") == "port").select(
        pl.col("component").str.split("/").list.get(0).alias("host"), pl.col("component").str.split("/").list.get(1).alias("device"))
    placement = fabric_attribution.rank_placement(held, ports, gpus=gpus,
                                                  gpu_nic=store.read("fabric_gpu_nic"), extra_ports=extra)
    attr = fabric_attribution.attribute_stragglers(placement, slow, unhealthy=unhealthy)
    sources = {j: sorted(set(k)) for j, k in slow.group_by("job_id").agg(pl.col("kind")).iter_rows()}
    return {"attribution": attr, "slow": slow,
            "findings": fabric_attribution.attribution_findings(attr, window_start=start, window_end=end, sources=sources)}


def fabric_health(store: Store, start: dt.datetime, end: dt.datetime) -> dict[str, Any]:
    """InfiniBand/RoCE links over [start, end) (``analyzers.ib_links``): per-port increases, rates and
    verdicts from the window's port samples, links narrower or slower than their peers (topology and the
    ports' own rates), their findings, and the usual HCA link rate the topology implies."""
    if end <= start:
        raise ValueError("end must be after start")
    if end - start > MAX_WINDOW:
        raise ValueError(f"window longer than {MAX_WINDOW}: fabric health reads raw port samples, so ask for at most a day")
    with tracer().start_as_current_span("health.fabric"):
        samples = store.read("fabric_port_sample", start=start, end=end)
        links = store.read("fabric_link")
        ports = ib_links.port_health(samples) if samples.height else pl.DataFrame()
        degraded = ib_links.degraded_links(links if links.height else None, samples if samples.height else None)
        found = ib_links.link_findings(ports if ports.height else None, degraded, window_start=start, window_end=end)
        return {"ports": ports, "degraded": degraded, "findings": found, "topology": links,
                "nic_rate_gbps": ib_links.nic_link_rate_gbps(links if links.height else None, samples if samples.height else None),
                "links": links.filter(pl.col("connected").fill_null(False) & (pl.col("a_kind") != "host")).height if links.height else 0}


ABSENCE_CARRY = dt.timedelta(minutes=30)
"""How long after its last update an absence finding is still carried into the next sweep: longer than
any beat interval, so a sweep that was skipped does not end an outage early."""


def absent(store: Store, samples: pl.DataFrame, gpus: pl.DataFrame, start: dt.datetime, end: dt.datetime) -> pl.DataFrame:
    """Absence findings at ``end``: members with samples in [start, end) that went quiet, plus those still
    quiet from earlier absence findings (``analyzers.absence``)."""
    seen = absence.last_seen(samples, gpus) if samples.height else pl.DataFrame(schema=absence.SEEN_SCHEMA)
    f = schema.metadata.tables["finding"]
    with store.engine.connect() as conn:
        rows = conn.execute(select(f.c.kind, f.c.subject, f.c.window_start, f.c.evidence)
                            .where(f.c.analyzer == "absence", f.c.window_end >= end - ABSENCE_CARRY)).all()
    open_ = pl.DataFrame([dict(r._mapping) for r in rows],
                         schema={"kind": pl.String, "subject": pl.String, "window_start": F.UTC_US, "evidence": pl.String})
    host_site = store.read("host", columns=["host", "site_id"])
    if open_.height:
        earlier = absence.carried(open_, gpus, host_site).filter(~pl.col("gpu_uuid").is_in(seen["gpu_uuid"].to_list()))
        seen = pl.concat([seen.select(earlier.columns), earlier], how="vertical_relaxed")
    return absence.absence_findings(seen, now=end, host_site=host_site)


PROGRESS_LOOKBACK = dt.timedelta(hours=24)
"""How far back a sweep looks for a job's steps: a job stalled for longer is still found (its last step
is in range) for a day, long past any collective timeout."""
_TERMINAL = ("finished", "failure", "preempted")


def job_progress(store: Store, now: dt.datetime) -> pl.DataFrame:
    """Per job with steps in the last ``PROGRESS_LOOKBACK``: first and last step time and distinct steps
    (from per-rank ``step`` rows or ``step`` job events, whichever saw more), its last terminal event, and
    the GPUs its ranks still hold (open ``job_rank`` rows)."""
    since = now - PROGRESS_LOOKBACK
    ts = F.UTC_US
    sched = {"job_id": pl.String, "last": ts, "first": ts, "steps": pl.Int64}
    a = store.query('SELECT job_id, MAX("end") AS last, MIN("start") AS first, COUNT(DISTINCT step) AS steps FROM step '
                    'WHERE "start" >= ? AND "start" <= ? GROUP BY job_id', [since, now], sched)
    b = store.query("SELECT job_id, MAX(ts) AS last, MIN(ts) AS first, COUNT(DISTINCT step) AS steps FROM job_event "
                    "WHERE kind = 'step' AND ts >= ? AND ts <= ? GROUP BY job_id", [since, now], sched)
    both = pl.concat([a, b]).sort("steps", descending=True).unique("job_id", keep="first")
    if both.height == 0:
        return pl.DataFrame(schema=hangs.PROGRESS_SCHEMA)
    marks = ", ".join("?" for _ in _TERMINAL)
    stopped = store.query(f"SELECT job_id, MAX(ts) AS stopped_ts FROM job_event WHERE kind IN ({marks}) AND ts >= ? AND ts <= ? GROUP BY job_id",
                          [*_TERMINAL, since, now], {"job_id": pl.String, "stopped_ts": ts})
    # 0 for a job whose ranks were all released; absent (unknown) for one never assigned through job_rank
    held = store.query('SELECT job_id, SUM(CASE WHEN "start" <= ? AND ("end" IS NULL OR "end" > ?) THEN 1 ELSE 0 END) AS gpus '
                       "FROM job_rank GROUP BY job_id", [now, now], {"job_id": pl.String, "gpus": pl.Int64})
    ended = store.query("SELECT job_id, ended_at FROM job WHERE ended_at IS NOT NULL AND ended_at <= ?", [now], {"job_id": pl.String, "ended_at": ts})
    out = (both.rename({"last": "last_progress_ts", "first": "first_progress_ts"})
           .join(stopped, on="job_id", how="left").join(ended, on="job_id", how="left")
           .with_columns(pl.max_horizontal("stopped_ts", "ended_at").alias("stopped_ts"))
           .join(held, on="job_id", how="left"))
    return out.select(list(hangs.PROGRESS_SCHEMA)).cast(hangs.PROGRESS_SCHEMA)


def watchdog_timeouts(store: Store, now: dt.datetime) -> pl.DataFrame:
    """PyTorch watchdog timeouts (``nccl_watchdog_timeout`` health events) of the last
    ``PROGRESS_LOOKBACK``, each with the job it concerns (``hangs.watchdog_by_job``)."""
    ts = F.UTC_US
    ev = store.query("SELECT ts, host, kind, code, message FROM health_event WHERE kind = 'nccl_watchdog_timeout' AND ts >= ? AND ts <= ?",
                     [now - PROGRESS_LOOKBACK, now], {"ts": ts, "host": pl.String, "kind": pl.String, "code": pl.Int64, "message": pl.String})
    if ev.height == 0:
        return pl.DataFrame(schema=hangs.WATCHDOG_SCHEMA)
    hosts = sorted(set(ev["host"].drop_nulls().to_list()) - {""})
    ranks = pl.DataFrame(schema={"job_id": pl.String, "host": pl.String, "start": ts, "end": ts})
    if hosts:
        marks = ", ".join("?" for _ in hosts)
        ranks = store.query(f'SELECT job_id, host, "start", "end" FROM job_rank WHERE host IN ({marks})', hosts,
                            {"job_id": pl.String, "host": pl.String, "start": ts, "end": ts})
    return hangs.watchdog_by_job(ev, ranks)


def run_probe(store: Store | None, backend: str = "numpy", *, gpu_uuid: str | None = None, host: str | None = None,
              device_index: int = 0) -> sdc_probe.ProbeResult:
    """Run the known-answer matmul probe and record it as a ``sdc_probe`` health event (value 1 = passed,
    0 = failed, null = no golden digest for that probe shape). A backend that cannot run here raises
    ``fleetscope.devices.probe.ProbeUnavailable`` and records nothing."""
    result = probe.run_probe(backend, device_index=device_index)
    if store is not None:
        node = host or socket.gethostname()
        # a device name alone (numpy's "cpu") is the same on every node: qualified by the node, as the agent does
        row = probe_event(result, ts=dt.datetime.now(dt.UTC), host=node, gpu_uuid=gpu_uuid or f"{backend}:{node}/{result.device}")
        store.write(F.Batch(source="probe", health_event=row))
    return result
