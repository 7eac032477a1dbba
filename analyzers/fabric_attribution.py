"""Where the fabric hurts: all-to-all utilisation against the bound the stored topology implies, and the
switch or link a job's communication stragglers share.

**Topology.** ``fabric_link`` holds HCA-to-switch links (``ibnetdiscover``: ``a_kind`` CA, ``a_host`` the
host, ``a_desc`` "host mlx5_0", ``b_node`` the leaf switch), switch-to-switch links (leaf uplinks to the
spine) and host-to-leaf placement rows (Slurm node features: ``a_kind`` host, ``b_node`` the leaf's name).
A *leaf* is a switch an HCA or a host hangs from; its *uplinks* are its connected switch-to-switch links.

**All-to-all bound, per leaf.** ``analyzers.fabric`` derives algbw ≤ min(4B/n, b·n/(n−1)) for one cut.
With the topology the cut can be every leaf's: n ranks each send S bytes spread evenly over the n ranks, so
the n_ℓ ranks whose NICs hang from leaf ℓ send n_ℓ·(n−n_ℓ)·S/n bytes out through its uplinks of U_ℓ GB/s
(the spine taken as non-blocking, as a two-level fat tree's is: Leiserson, "Fat-Trees", IEEE Trans.
Computers 1985; Al-Fares et al., SIGCOMM 2008), so algbw ≤ n·U_ℓ/(n_ℓ(n−n_ℓ)); with two leaves of n/2
ranks each this is 4U/n, the bisection bound. Injection: a rank's traffic to other hosts, (n−r)·S/n with
r ranks per host (same-host peers use NVLink), leaves through its NIC share b (the host's HCA rates / r),
so algbw ≤ b·n/(n−r). The bound is the smallest of these; busbw bound = algbw bound × (n−1)/n
(nccl-tests ``doc/PERFORMANCE.md``). A host's ranks are spread evenly over its HCA ports (NCCL pairs
each GPU with its nearest NIC, one per GPU on rail-optimised nodes).

``low_ratio`` (0.5) is a heuristic, not a published figure: a run below half its bound has lost at least
half of its narrowest cut, which is what one failed uplink of two, a 4X link trained down to 2X, or a
congested spine does; the bound is reachable only by a perfectly balanced schedule, so smaller shortfalls
are left alone.

**Attribution.** A communication straggler (C³ attribution ``communication_slow``, Stragglers), a slow
host or a slow point-to-point link waits on the fabric somewhere. Each rank of the job is placed under
its host, its HCA port (through ``fabric_gpu_nic`` where the GPU's NIC is known, else the host's only
port) and its leaf switch. A component is suspect when it holds at least half of the job's slow ranks,
slow ranks are more common under it than elsewhere in the job (a lift above 1), and not every rank of
the job sits under it (a component every rank shares localises nothing). Among suspects, one with an
unhealthy link finding (``analyzers.ib_links``) on it comes first, then the one holding the most slow
ranks, then the narrowest (a port before its leaf). This is group testing, as ``analyzers.fabric.slow_members``, over the topology
instead of over collectives.

Pure: polars frames in, polars frames out.
"""

from __future__ import annotations

import json
import re
from datetime import datetime

import polars as pl

from fleetscope.core.frames import findings_frame, require_columns

__all__ = ["LOW_RATIO", "host_ports", "leaf_uplinks_gbps", "alltoall_utilization", "utilization_findings",
           "rank_placement", "attribute_stragglers", "attribution_findings", "unhealthy_components"]

LOW_RATIO = 0.5
MIN_SIZE_BYTES = 1 << 26  # bandwidth-bound sizes, as analyzers.fabric.nccl_test_groups
PORTS_SCHEMA = {"host": pl.String, "device": pl.String, "hca_node": pl.String, "leaf": pl.String, "leaf_desc": pl.String,
                "rate_gbps": pl.Float64}
_LEVEL_ORDER = {"port": 0, "host": 1, "leaf": 2}


def host_ports(links: pl.DataFrame) -> pl.DataFrame:
    """One row per host HCA port (host, device, hca_node GUID, leaf, leaf_desc, rate_gbps) from connected
    CA-to-switch links, plus one per host placement row (device and rate null) for hosts without any."""
    require_columns(links, "fabric_link", ("a_node", "a_kind", "a_desc", "a_host", "b_node", "b_kind", "b_desc", "rate_gbps", "connected"))
    up = links.filter(pl.col("connected").fill_null(False) & pl.col("b_node").is_not_null())
    ca = up.filter((pl.col("a_kind") == "CA") & (pl.col("b_kind") == "SW") & pl.col("a_host").is_not_null()).select(
        pl.col("a_host").alias("host"),
        pl.col("a_desc").str.split(" ").list.get(1, null_on_oob=True).alias("device"),
        pl.col("a_node").alias("hca_node"), pl.col("b_node").alias("leaf"), pl.col("b_desc").alias("leaf_desc"), "rate_gbps")
    placed = up.filter(pl.col("a_kind") == "host").select(
        pl.col("a_node").alias("host"), pl.lit(None, pl.String).alias("device"), pl.lit(None, pl.String).alias("hca_node"),
        pl.col("b_node").alias("leaf"), pl.col("b_desc").alias("leaf_desc"), pl.lit(None, pl.Float64).alias("rate_gbps"))
    placed = placed.filter(~pl.col("host").is_in(ca["host"].implode()))
    return pl.concat([ca.cast(PORTS_SCHEMA), placed.cast(PORTS_SCHEMA)]).unique(["host", "device", "leaf"], keep="first").sort("host", "device", nulls_last=True)


def leaf_uplinks_gbps(links: pl.DataFrame, ports: pl.DataFrame | None = None) -> pl.DataFrame:
    """Per leaf (a switch an HCA or a host hangs from): the sum of its connected switch-to-switch links'
    rates, GB/s (Gb/s / 8), and how many there are. Leaves with no uplink in the topology are absent."""
    ports = host_ports(links) if ports is None else ports
    leaves = ports.get_column("leaf").unique()
    sw = links.filter(pl.col("connected").fill_null(False) & (pl.col("a_kind") == "SW") & (pl.col("b_kind") == "SW")
                      & pl.col("rate_gbps").is_not_null())
    ends = pl.concat([sw.select(pl.col("a_node").alias("leaf"), "rate_gbps"), sw.select(pl.col("b_node").alias("leaf"), "rate_gbps")])
    return ends.filter(pl.col("leaf").is_in(leaves.implode())).group_by("leaf").agg(
        (pl.col("rate_gbps").sum() / 8).alias("uplink_gbps"), pl.len().alias("uplinks")).sort("leaf")


def _run_bound(n: int, hosts: list[str], ports: pl.DataFrame, uplinks: dict[str, float], nic_rate_gbps: float | None) -> dict:
    """The all-to-all algbw bound (GB/s) for one run of ``n`` ranks over ``hosts``, with what binds."""
    r = n / len(hosts)
    hp = ports.filter(pl.col("host").is_in(hosts))
    out: dict = {"ranks_per_host": r, "hosts_placed": hp.get_column("host").n_unique(), "leaves": 0}
    # injection: the slowest host's NIC share per rank
    inj = None
    if r < n:
        shares = []
        for h in hosts:
            rates = hp.filter(pl.col("host") == h).get_column("rate_gbps").drop_nulls()
            total_gbps = float(rates.sum()) / 8 if rates.len() else (nic_rate_gbps * r / 8 if nic_rate_gbps else None)
            if total_gbps:
                shares.append(total_gbps / r)
        if len(shares) == len(hosts):
            inj = min(shares) * n / (n - r)
    out["injection_algbw_gbps"] = inj
    # per leaf: the ranks whose NICs hang from it, spread evenly over each host's ports
    per_leaf: dict[str, float] = {}
    for h in hosts:
        hl = hp.filter(pl.col("host") == h).get_column("leaf").to_list()
        for leaf in hl:
            per_leaf[leaf] = per_leaf.get(leaf, 0.0) + r / len(hl)
    out["leaves"] = len(per_leaf)
    leaf_bound, worst, unknown = None, None, []
    for leaf, nl in per_leaf.items():
        if nl >= n - 1e-9:
            continue  # every rank under one leaf: nothing crosses its uplinks
        if leaf not in uplinks:
            unknown.append(leaf)
            continue
        b = n * uplinks[leaf] / (nl * (n - nl))
        if leaf_bound is None or b < leaf_bound:
            leaf_bound, worst = b, leaf
    out.update(leaf_algbw_gbps=leaf_bound, leaf=worst, leaves_without_uplinks=sorted(unknown)[:20])
    cands = [(v, k) for v, k in ((inj, "injection"), (leaf_bound, "leaf_uplinks")) if v is not None]
    out["bound_algbw_gbps"], out["limit"] = min(cands) if cands else (None, None)
    return out


UTILIZATION_SCHEMA = {"run_id": pl.String, "ts": pl.Datetime("us", "UTC"), "hosts": pl.String, "nranks": pl.Int64,
                      "size_bytes": pl.Int64, "algbw_gbps": pl.Float64, "busbw_gbps": pl.Float64, "bound_algbw_gbps": pl.Float64,
                      "bound_busbw_gbps": pl.Float64, "utilization_ratio": pl.Float64, "limit": pl.String, "leaf": pl.String,
                      "ranks_per_host": pl.Float64, "injection_algbw_gbps": pl.Float64, "leaf_algbw_gbps": pl.Float64,
                      "leaves": pl.Int64, "low": pl.Boolean}


def alltoall_utilization(nccl_test: pl.DataFrame, links: pl.DataFrame | None, *, nic_rate_gbps: float | None = None,
                         low_ratio: float = LOW_RATIO, min_size_bytes: int = MIN_SIZE_BYTES) -> pl.DataFrame:
    """Per nccl-tests all-to-all run over known hosts: its best bandwidth at sizes ≥ ``min_size_bytes``
    (``alltoall_perf`` reports algbw and busbw per size) against the topology's bound, ``utilization_ratio``
    = busbw / bound busbw, ``low`` below ``low_ratio``. Runs whose bound cannot be computed (no topology for
    their hosts, no uplink rates, one host without a NIC rate) carry a null ratio. ``nic_rate_gbps`` (Gb/s)
    stands in for a host whose HCA links the topology lacks."""
    require_columns(nccl_test, "nccl_test", ("run_id", "op", "size_bytes", "algbw_gbps", "busbw_gbps", "nranks", "hosts", "ts"))
    empty = pl.DataFrame(schema=UTILIZATION_SCHEMA)
    d = nccl_test.filter(pl.col("op").str.to_lowercase().str.replace_all("_", "").is_in(["alltoall", "alltoallv"])
                         & (pl.col("size_bytes") >= min_size_bytes) & pl.col("hosts").is_not_null() & (pl.col("nranks") >= 2))
    if d.height == 0:
        return empty
    best = d.sort("algbw_gbps", descending=True).group_by("run_id").agg(
        pl.col("ts").min(), pl.col("hosts").first(), pl.col("nranks").first(), pl.col("size_bytes").first(),
        pl.col("algbw_gbps").first(), pl.col("busbw_gbps").first()).sort("ts", "run_id")
    ports = host_ports(links) if links is not None and links.height else pl.DataFrame(schema=PORTS_SCHEMA)
    uplinks = dict(leaf_uplinks_gbps(links, ports).select("leaf", "uplink_gbps").iter_rows()) if links is not None and links.height else {}
    rows = []
    for r in best.to_dicts():
        hosts = [h for h in dict.fromkeys(x.strip() for x in r["hosts"].split(",")) if h]
        n = int(r["nranks"])
        if not hosts:
            continue
        b = _run_bound(n, hosts, ports, uplinks, nic_rate_gbps)
        bound = b["bound_algbw_gbps"]
        bus_bound = bound * (n - 1) / n if bound else None
        ratio = r["busbw_gbps"] / bus_bound if bus_bound else None
        rows.append({**r, "bound_algbw_gbps": bound, "bound_busbw_gbps": bus_bound, "utilization_ratio": ratio, "limit": b["limit"],
                     "leaf": b["leaf"] if b["limit"] == "leaf_uplinks" else None, "ranks_per_host": b["ranks_per_host"],
                     "injection_algbw_gbps": b["injection_algbw_gbps"], "leaf_algbw_gbps": b["leaf_algbw_gbps"], "leaves": b["leaves"],
                     "low": ratio is not None and ratio < low_ratio})
    return pl.DataFrame(rows, schema=UTILIZATION_SCHEMA) if rows else empty


def utilization_findings(util: pl.DataFrame, *, low_ratio: float = LOW_RATIO) -> pl.DataFrame:
    """``alltoall_low_utilization`` findings (warning), one per run below ``low_ratio`` of its bound,
    dated by the run (a re-run sweep updates the same finding)."""
    rows = []
    for r in util.filter(pl.col("low")).to_dicts():
        where = f"leaf {r['leaf']}'s uplinks" if r["limit"] == "leaf_uplinks" else "the hosts' NICs"
        rows.append({"analyzer": "fabric", "kind": "alltoall_low_utilization", "subject": f"nccl_test:{r['run_id']}",
                     "window_start": r["ts"], "window_end": r["ts"], "severity": "warning", "score": float(r["utilization_ratio"]),
                     "summary": f"nccl-tests alltoall over {r['nranks']} ranks on {r['hosts']} reached {r['busbw_gbps']:.1f} GB/s bus bandwidth, "
                                f"{r['utilization_ratio']:.0%} of the {r['bound_busbw_gbps']:.1f} GB/s the topology allows ({where} bind); "
                                f"below {low_ratio:.0%}.",
                     "evidence": json.dumps({**r, "low_ratio": low_ratio}, default=str, sort_keys=True)})
    return findings_frame(rows)


# --- attribution ------------------------------------------------------------------------------------------

_HOST_PORT = re.compile(r"^host:(?P<host>[^/]+)/ib:(?P<device>[^:]+):(?P<port>\d+)$")
_NODE_PORT = re.compile(r"^(?:ib-link|ib):(?P<node>[^/]+)/(?P<port>\d+)$")


def unhealthy_components(findings: pl.DataFrame, ports: pl.DataFrame) -> pl.DataFrame:
    """The components (level, component) that ``analyzers.ib_links`` findings name: a host's HCA port
    (``host:<h>/ib:<dev>:<port>``, or a degraded link ``ib-link:<hca guid>/<port>``), or a leaf switch
    (a fabric-side port ``ib:<switch guid>/<port>``). Returns level, component, kind, subject, summary."""
    require_columns(findings, "finding", ("kind", "subject", "summary"))
    by_guid = {g: (h, d) for h, d, g in ports.select("host", "device", "hca_node").drop_nulls("hca_node").iter_rows()}
    leaves = set(ports.get_column("leaf").drop_nulls().to_list())
    rows = []
    for kind, subject, summary in findings.select("kind", "subject", "summary").iter_rows():
        if not kind.startswith("ib_"):
            continue
        if m := _HOST_PORT.match(subject):
            rows.append(("port", f"{m['host']}/{m['device']}", kind, subject, summary))
        elif m := _NODE_PORT.match(subject):
            node = m["node"]
            if node in by_guid:
                rows.append(("port", "/".join(by_guid[node]), kind, subject, summary))
            elif node in leaves:
                rows.append(("leaf", node, kind, subject, summary))
    return pl.DataFrame(rows, schema={"level": pl.String, "component": pl.String, "kind": pl.String, "subject": pl.String, "summary": pl.String},
                        orient="row")


def rank_placement(ranks: pl.DataFrame, ports: pl.DataFrame, *, gpus: pl.DataFrame | None = None,
                   gpu_nic: pl.DataFrame | None = None, extra_ports: pl.DataFrame | None = None) -> pl.DataFrame:
    """Each rank (job_id, rank, host, gpu_uuid) under its components: one row per (rank, level,
    component), levels ``port`` ("host/device"), ``host`` and ``leaf`` (switch). A rank's NIC is the one
    ``fabric_gpu_nic`` pairs with its GPU (by PCI bus id, or ``GPU<index>`` from ``nvidia-smi topo -m``;
    the host's own rows first, then a machine-type topology's, host ""), else its host's only port.
    ``extra_ports`` (host, device) adds ports the topology lacks (named by port-counter findings)."""
    require_columns(ranks, "job_rank", ("job_id", "rank", "host"))
    known = ports.select("host", "device", "leaf")
    if extra_ports is not None and extra_ports.height:
        add = extra_ports.select("host", "device").join(known.select("host", "device"), on=["host", "device"], how="anti")
        known = pl.concat([known, add.with_columns(pl.lit(None, pl.String).alias("leaf"))])
    r = ranks.select("job_id", "rank", "host", *(["gpu_uuid"] if "gpu_uuid" in ranks.columns else [])).filter(pl.col("host").is_not_null()).unique(["job_id", "rank"])
    nic = pl.DataFrame(schema={"job_id": pl.String, "rank": pl.Int64, "device": pl.String})
    if gpus is not None and gpus.height and gpu_nic is not None and gpu_nic.height and "gpu_uuid" in r.columns:
        g = r.join(gpus.select("gpu_uuid", "pci_bus_id", "gpu_index"), on="gpu_uuid", how="left")
        gn = gpu_nic.select("host", "gpu_bus_id", pl.col("nic_bus_id").alias("device"))
        cands = []
        for key in ("pci_bus_id", "gpu_index"):
            gk = g.with_columns((pl.col(key).str.to_lowercase() if key == "pci_bus_id" else pl.concat_str([pl.lit("GPU"), pl.col(key).cast(pl.String)]))
                                .alias("gpu_bus_id"))
            for same_host in (True, False):
                side = gn.filter(pl.col("host") != "") if same_host else gn.filter(pl.col("host") == "").drop("host")
                on = ["host", "gpu_bus_id"] if same_host else ["gpu_bus_id"]
                cands.append(gk.join(side, on=on, how="inner").select("job_id", "rank", "host", "device"))
        nic = (pl.concat(cands).join(known.select("host", "device"), on=["host", "device"], how="semi")
               .unique(["job_id", "rank"], keep="first", maintain_order=True).select("job_id", "rank", "device"))
    per_host = known.group_by("host").agg(pl.col("device").drop_nulls().unique().alias("devices"))
    only = per_host.filter(pl.col("devices").list.len() == 1).select("host", pl.col("devices").list.first().alias("only"))
    placed = (r.join(nic, on=["job_id", "rank"], how="left").join(only, on="host", how="left")
              .with_columns(pl.coalesce("device", "only").alias("device")))
    port_rows = placed.filter(pl.col("device").is_not_null()).select(
        "job_id", "rank", pl.lit("port").alias("level"), pl.concat_str([pl.col("host"), pl.lit("/"), pl.col("device")]).alias("component"))
    # leaf: the rank's port's leaf, else every leaf of its host (a placement row, or ports unknown per GPU)
    by_port = placed.filter(pl.col("device").is_not_null()).join(known.drop_nulls("leaf"), on=["host", "device"], how="inner")
    by_host = placed.join(by_port.select("job_id", "rank"), on=["job_id", "rank"], how="anti").join(
        known.drop_nulls("leaf").select("host", "leaf"), on="host", how="inner")
    leaf_rows = pl.concat([by_port.select("job_id", "rank", "leaf"), by_host.select("job_id", "rank", "leaf")]).select(
        "job_id", "rank", pl.lit("leaf").alias("level"), pl.col("leaf").alias("component"))
    host_rows = r.select("job_id", "rank", pl.lit("host").alias("level"), pl.col("host").alias("component"))
    return pl.concat([port_rows, host_rows, leaf_rows]).unique().sort("job_id", "level", "component", "rank")


ATTRIBUTION_SCHEMA = {"job_id": pl.String, "level": pl.String, "component": pl.String, "ranks": pl.Int64, "slow": pl.Int64,
                      "slow_ranks": pl.List(pl.Int64), "coverage_ratio": pl.Float64, "lift_ratio": pl.Float64,
                      "unhealthy": pl.List(pl.String), "suspect": pl.Boolean, "best": pl.Boolean}


def attribute_stragglers(placement: pl.DataFrame, slow: pl.DataFrame, *, unhealthy: pl.DataFrame | None = None,
                         min_coverage: float = 0.5) -> pl.DataFrame:
    """Per job and component under which at least one slow rank sits: its ranks, slow ranks, coverage
    (share of the job's slow ranks under it), lift (slow share under it / slow share elsewhere; inf when
    none elsewhere), the unhealthy link findings on it, ``suspect`` and ``best`` (one per job)."""
    require_columns(placement, "placement", ("job_id", "rank", "level", "component"))
    require_columns(slow, "slow", ("job_id", "rank"))
    s = slow.select("job_id", pl.col("rank").cast(pl.Int64)).unique()
    if s.height == 0 or placement.height == 0:
        return pl.DataFrame(schema=ATTRIBUTION_SCHEMA)
    totals = placement.group_by("job_id").agg(pl.col("rank").n_unique().alias("_job_ranks"))
    nslow = s.join(placement.select("job_id", "rank").unique(), on=["job_id", "rank"]).group_by("job_id").agg(pl.len().alias("_job_slow"))
    p = placement.join(s.with_columns(pl.lit(True).alias("_slow")), on=["job_id", "rank"], how="left").with_columns(pl.col("_slow").fill_null(False))
    g = p.group_by("job_id", "level", "component").agg(
        pl.col("rank").n_unique().alias("ranks"), pl.col("_slow").sum().cast(pl.Int64).alias("slow"),
        pl.col("rank").filter(pl.col("_slow")).unique().sort().alias("slow_ranks"))
    g = g.filter(pl.col("slow") > 0).join(totals, on="job_id").join(nslow, on="job_id")
    rest_ranks = pl.col("_job_ranks") - pl.col("ranks")
    rest_share = pl.when(rest_ranks > 0).then((pl.col("_job_slow") - pl.col("slow")) / rest_ranks)
    g = g.with_columns((pl.col("slow") / pl.col("_job_slow")).alias("coverage_ratio"),
                       pl.when(rest_share > 0).then((pl.col("slow") / pl.col("ranks")) / rest_share)
                       .when(rest_ranks > 0).then(float("inf")).alias("lift_ratio"))
    u = (unhealthy if unhealthy is not None and unhealthy.height else pl.DataFrame(schema={"level": pl.String, "component": pl.String, "subject": pl.String}))
    u = u.group_by("level", "component").agg(pl.col("subject").unique().sort().alias("unhealthy"))
    g = g.join(u, on=["level", "component"], how="left").with_columns(pl.col("unhealthy").fill_null(pl.lit([], pl.List(pl.String))))
    g = g.with_columns(((pl.col("coverage_ratio") >= min_coverage) & (pl.col("lift_ratio") > 1.0) & (pl.col("ranks") < pl.col("_job_ranks")))
                       .fill_null(False).alias("suspect"))
    order = g.with_columns((pl.col("unhealthy").list.len() == 0).alias("_no_bad"),
                           pl.col("level").replace_strict(_LEVEL_ORDER, default=9, return_dtype=pl.Int64).alias("_lvl"))
    order = order.sort(["job_id", "suspect", "_no_bad", "slow", "_lvl", "component"], descending=[False, True, False, True, False, False])
    first = pl.int_range(pl.len()).over("job_id") == 0
    return order.with_columns((first & pl.col("suspect")).alias("best")).select(list(ATTRIBUTION_SCHEMA)).cast(ATTRIBUTION_SCHEMA)  # type: ignore[arg-type]


def attribution_findings(attr: pl.DataFrame, *, window_start: datetime, window_end: datetime,
                         sources: dict[str, list[str]] | None = None) -> pl.DataFrame:
    """``comm_straggler_fabric`` findings, one per job with a suspect: subject ``job:<id>/ib:<component>``,
    critical when an unhealthy link finding is on the suspect (the telemetry agrees), else warning;
    evidence: the slow ranks under it, its ranks, coverage, lift, the unhealthy findings, the other
    suspects, and what marked the ranks slow (``sources``: job id → finding kinds)."""
    rows = []
    for r in attr.filter("best").to_dicts():
        others = attr.filter((pl.col("job_id") == r["job_id"]) & pl.col("suspect") & ~pl.col("best")).select("level", "component", "slow").to_dicts()
        what = {"port": f"HCA port {r['component']}", "host": f"host {r['component']}'s links"}.get(r["level"], f"leaf switch {r['component']}")
        bad = f"; the link telemetry agrees ({', '.join(r['unhealthy'][:3])})" if r["unhealthy"] else ""
        rows.append({"analyzer": "fabric", "kind": "comm_straggler_fabric", "subject": f"job:{r['job_id']}/ib:{r['component']}",
                     "window_start": window_start, "window_end": window_end, "severity": "critical" if r["unhealthy"] else "warning",
                     "score": float(r["coverage_ratio"]),
                     "summary": f"{r['slow']} of job {r['job_id']}'s slow-communicating ranks ({r['coverage_ratio']:.0%}) sit under {what}, "
                                f"which {r['ranks']} of its ranks share{bad}: suspect it.",
                     "evidence": json.dumps({**r, "lift_ratio": None if r["lift_ratio"] in (None, float("inf")) else r["lift_ratio"],
                                             "lift_unbounded": r["lift_ratio"] == float("inf"), "other_suspects": others[:20],
                                             "slow_from": (sources or {}).get(r["job_id"], [])}, default=str, sort_keys=True)})
    return findings_frame(rows)
