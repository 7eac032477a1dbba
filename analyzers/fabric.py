"""Fabric: bus bandwidth per collective and size against the fabric's peak, slow ranks / nodes / links,
regressions of nccl-tests runs, and the bisection bound for all-to-all.

Bus bandwidth (nccl-tests ``doc/PERFORMANCE.md`` and each test's ``GetBw``): algbw = S / t, where S is
the bytes the test names (for all_gather / reduce_scatter / alltoall: the whole buffer, count × nranks ×
type size); busbw = algbw × factor, the factor making busbw comparable with the hardware's link
bandwidth whatever the collective:

    all_reduce 2(n−1)/n · all_gather, reduce_scatter, alltoall, gather, scatter, hypercube (n−1)/n ·
    broadcast, reduce, sendrecv 1

NCCL's Inspector reports the same two figures per operation (``coll_algobw_gbs``, ``coll_busbw_gbs``).

Slow members by group testing. A collective moves at the pace of its slowest link, and a rank's kernel
time includes its wait for the last peer (docs/ARCHITECTURE.md, C³ model), so a per-rank duration blames the wrong
rank. Instead each *group* (a communicator's collective, an nccl-tests run over a set of hosts) gets one
fabric figure — the best busbw any member saw, i.e. the transfer without the wait — compared with groups
of the same shape (op, size, ranks); a member is slow when the groups it belongs to are consistently
slower than their peers. This is how fleets localise bad nodes with pairwise nccl-tests.

All-to-all must cross the fabric's narrowest cut. With n ranks each sending S bytes spread evenly, the
traffic from one half of the ranks to the other is (n/2)·(n/2)·(S/n) = nS/4 each way, so with bisection
bandwidth B per direction t ≥ nS/(4B): algbw = S/t ≤ 4B/n. Each rank must also push (n−1)S/n through its
own link of bandwidth b: algbw ≤ b·n/(n−1). The bound is the smaller of the two.

Pure: polars frames in, polars frames out.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from datetime import datetime

import polars as pl

from fleetscope.core.errors import ValidationError
from fleetscope.core.frames import UTC_US, findings_frame, require_columns

__all__ = [
    "canonical_op",
    "busbw_factor",
    "check_bus_bandwidth",
    "infer_nranks",
    "bandwidth_vs_peak",
    "collective_groups",
    "nccl_test_groups",
    "slow_members",
    "slow_links",
    "nccl_test_regressions",
    "alltoall_bound_gbps",
    "alltoall_bisection_utilization",
    "fabric_findings",
]

_TWO = {"all_reduce"}
_N1N = {"all_gather", "reduce_scatter", "alltoall", "gather", "scatter", "hypercube"}
_ONE = {"broadcast", "reduce", "sendrecv", "send", "recv"}
_ALIASES = {
    "allreduce": "all_reduce", "allgather": "all_gather", "reducescatter": "reduce_scatter", "alltoall": "alltoall",
    "alltoallv": "alltoall", "broadcast": "broadcast", "bcast": "broadcast", "reduce": "reduce", "sendrecv": "sendrecv",
    "send": "send", "recv": "recv", "gather": "gather", "scatter": "scatter", "hypercube": "hypercube",
}


def canonical_op(op: str) -> str:
    """nccl-tests' operation name for any spelling: ``AllReduce`` (NCCL, Inspector), ``allreduce``,
    ``all_reduce`` (nccl-tests), ``nccl:all_reduce`` (PyTorch) → ``all_reduce``."""
    key = op.strip().lower().split(":")[-1].replace("_", "").replace("-", "").replace(" ", "")
    key = key.removeprefix("nccl").removesuffix("perf") or key
    if key not in _ALIASES:
        raise ValueError(f"unknown collective {op!r}")
    return _ALIASES[key]


def busbw_factor(op: str, nranks: int) -> float:
    """busbw / algbw for ``op`` on ``nranks`` ranks (nccl-tests)."""
    if nranks < 1:
        raise ValueError("nranks must be >= 1")
    c = canonical_op(op)
    if c in _TWO:
        return 2 * (nranks - 1) / nranks
    if c in _N1N:
        return (nranks - 1) / nranks
    return 1.0


def _factor_expr(op: pl.Expr, n: pl.Expr) -> pl.Expr:
    n = n.cast(pl.Float64)
    return (pl.when(op.is_in(list(_TWO))).then(2 * (n - 1) / n)
            .when(op.is_in(list(_N1N))).then((n - 1) / n)
            .when(op.is_in(list(_ONE))).then(pl.lit(1.0))
            .otherwise(None))



def _canon_ops(df: pl.DataFrame) -> pl.DataFrame:
    ops = df.get_column("op").unique().to_list()
    mapping = {o: canonical_op(o) for o in ops if o is not None}
    return df.with_columns(pl.col("op").replace_strict(mapping, return_dtype=pl.String).alias("op_canonical"))


def check_bus_bandwidth(df: pl.DataFrame, *, nranks: int | None = None, rounding_gbps: float = 0.005) -> pl.DataFrame:
    """busbw = algbw × factor(op, n), row by row, on ``nccl_test`` or ``collective`` rows.

    ``nranks`` overrides the frame's ``nranks`` column (an excerpt may lack the device list). Printed
    figures are rounded to 0.01 GB/s, so a row is ``consistent`` when |busbw − algbw·factor| ≤
    rounding·(1 + factor) (the rounding of both numbers, carried through).
    """
    require_columns(df, "frame", ("op", "algbw_gbps", "busbw_gbps"))
    if nranks is None and ("nranks" not in df.columns or df.get_column("nranks").null_count() == df.height):
        raise ValidationError("no rank count: pass nranks= (or infer it with infer_nranks)", frame="frame", field="nranks")
    d = _canon_ops(df)
    n = pl.lit(nranks) if nranks is not None else pl.col("nranks")
    d = d.with_columns(_factor_expr(pl.col("op_canonical"), n).alias("busbw_factor"))
    return d.with_columns((pl.col("algbw_gbps") * pl.col("busbw_factor")).alias("busbw_expected_gbps")).with_columns(
        (pl.col("busbw_gbps") - pl.col("busbw_expected_gbps")).alias("busbw_deviation_gbps"),
        ((pl.col("busbw_gbps") - pl.col("busbw_expected_gbps")).abs() <= rounding_gbps * (1 + pl.col("busbw_factor")) + 1e-9)
        .alias("consistent"),
    )


def infer_nranks(op: str, algbw_gbps: float, busbw_gbps: float, *, max_ranks: int = 1 << 20) -> int | None:
    """The rank count that makes busbw / algbw equal the op's factor, or None when the op's factor does
    not depend on n (broadcast, reduce) or the ratio fits no n. Use the most precise row (largest algbw)."""
    c = canonical_op(op)
    if algbw_gbps <= 0 or c in _ONE:
        return None
    r = busbw_gbps / algbw_gbps
    if c in _TWO:
        if not 1.0 <= r < 2.0:
            return None
        n = 2 / (2 - r)
    else:
        if not 0.5 <= r < 1.0:
            return None
        n = 1 / (1 - r)
    k = round(n)
    return k if 2 <= k <= max_ranks and abs(busbw_factor(c, k) - r) < 0.01 else None


def bandwidth_vs_peak(df: pl.DataFrame, peak_busbw_gbps: float | Mapping[str, float]) -> pl.DataFrame:
    """Median achieved busbw per (op, message size) against the fabric's expected peak busbw (one number,
    or per op). Works on ``nccl_test`` (``size_bytes``) and ``collective`` (``bytes``) rows."""
    size = "size_bytes" if "size_bytes" in df.columns else "bytes"
    require_columns(df, "frame", ("op", size, "busbw_gbps"))
    d = _canon_ops(df).group_by("op_canonical", size).agg(
        pl.col("busbw_gbps").median().alias("busbw_gbps"), pl.len().alias("samples"))
    if isinstance(peak_busbw_gbps, Mapping):
        peaks = {canonical_op(k): float(v) for k, v in peak_busbw_gbps.items()}
        d = d.with_columns(pl.col("op_canonical").replace_strict(peaks, default=None, return_dtype=pl.Float64).alias("peak_busbw_gbps"))
    else:
        if not peak_busbw_gbps > 0:
            raise ValueError("peak bus bandwidth must be positive")
        d = d.with_columns(pl.lit(float(peak_busbw_gbps)).alias("peak_busbw_gbps"))
    return d.with_columns((pl.col("busbw_gbps") / pl.col("peak_busbw_gbps")).alias("peak_ratio")).rename(
        {"op_canonical": "op", size: "size_bytes"}).sort("op", "size_bytes")


# --- slow ranks, nodes, links ---------------------------------------------------------------------------


def collective_groups(collective: pl.DataFrame, *, member: str = "rank") -> pl.DataFrame:
    """One fabric figure per collective instance (job, communicator, seq, op): the best busbw any rank saw
    (the transfer without waiting), with its shape key (op, bytes, nranks) and its members (ranks, or
    hosts with ``member="host"``). Point-to-point rows (peer ≥ 0) are left to ``slow_links``."""
    require_columns(collective, "collective", ("job_id", "rank", "comm_id", "seq", "op", "busbw_gbps", member))
    c = collective
    if "peer" in c.columns:
        c = c.filter(pl.col("peer") < 0)
    size = pl.col("bytes") if "bytes" in c.columns else pl.lit(None, pl.Int64)
    g = _canon_ops(c.filter(pl.col("busbw_gbps").is_not_null())).group_by("job_id", "comm_id", "seq", "op_canonical").agg(
        pl.col("busbw_gbps").max().alias("busbw_gbps"),
        size.max().alias("size_bytes"),
        pl.col(member).cast(pl.String).unique().sort().alias("members"),
        pl.col("rank").n_unique().alias("nranks"),
    )
    return g.select(
        pl.concat_str([pl.col("job_id"), pl.col("comm_id"), pl.col("seq").cast(pl.String)], separator="/").alias("group_id"),
        pl.concat_str([pl.col("op_canonical"), pl.col("size_bytes").cast(pl.String).fill_null("?"), pl.col("nranks").cast(pl.String)],
                      separator="/").alias("shape"),
        "members", "busbw_gbps",
    )


def nccl_test_groups(nccl_test: pl.DataFrame, *, min_size_bytes: int = 1 << 26) -> pl.DataFrame:
    """One fabric figure per nccl-tests run: the median busbw over sizes ≥ ``min_size_bytes``
    (bandwidth-bound; small sizes measure latency), shape (op, nranks), members = the run's hosts."""
    require_columns(nccl_test, "nccl_test", ("run_id", "op", "size_bytes", "busbw_gbps", "hosts"))
    big = nccl_test.filter(pl.col("size_bytes") >= min_size_bytes)
    nr = pl.col("nranks").first().cast(pl.String).fill_null("?") if "nranks" in big.columns else pl.lit("?")
    return _canon_ops(big).group_by("run_id").agg(
        pl.col("busbw_gbps").median().alias("busbw_gbps"),
        pl.concat_str([pl.col("op_canonical").first(), nr], separator="/").alias("shape"),
        pl.col("hosts").first().str.split(",").alias("members"),
    ).filter(pl.col("members").list.len() > 0).rename({"run_id": "group_id"}).select("group_id", "shape", "members", "busbw_gbps")


def slow_members(groups: pl.DataFrame, *, threshold: float = 0.8, min_groups: int = 2) -> pl.DataFrame:
    """Members whose groups run slower than peer groups of the same shape.

    ``groups``: group_id, shape, members (list), busbw_gbps (``collective_groups`` / ``nccl_test_groups``).
    Each group's ratio = its busbw / the median busbw of its shape; a member's score is the median ratio
    over its groups (a median, so one unlucky group does not condemn it), ``slow`` when the score is below
    ``threshold`` over at least ``min_groups`` groups, and ``innocent_groups`` counts its groups at or above
    the threshold (a bad node leaves none)."""
    require_columns(groups, "groups", ("group_id", "shape", "members", "busbw_gbps"))
    g = groups.filter(pl.col("busbw_gbps") > 0).with_columns(
        (pl.col("busbw_gbps") / pl.col("busbw_gbps").median().over("shape")).alias("ratio"),
        pl.len().over("shape").alias("_peers"),
    ).filter(pl.col("_peers") >= 2)  # a shape seen once has nothing to compare with
    m = g.explode("members").rename({"members": "member"}).group_by("member").agg(
        pl.col("ratio").median().alias("score"),
        pl.len().alias("groups"),
        (pl.col("ratio") >= threshold).sum().alias("innocent_groups"),
        pl.col("group_id").filter(pl.col("ratio") < threshold).sort().head(20).alias("slow_groups"),
    )
    return m.with_columns(((pl.col("score") < threshold) & (pl.col("groups") >= min_groups)).alias("slow")).sort("score", "member")


def slow_links(collective: pl.DataFrame, *, threshold: float = 0.8, min_ops: int = 3) -> pl.DataFrame:
    """Point-to-point pairs (rank → peer, with hosts where known) whose median bandwidth is below
    ``threshold`` × the median over all pairs moving the same message size."""
    require_columns(collective, "collective", ("job_id", "rank", "peer", "op", "busbw_gbps"))
    p = collective.filter((pl.col("peer") >= 0) & pl.col("busbw_gbps").is_not_null())
    size = pl.col("bytes") if "bytes" in p.columns else pl.lit(0)
    pairs = p.group_by("job_id", "rank", "peer", size.alias("size_bytes")).agg(
        pl.col("busbw_gbps").median().alias("busbw_gbps"), pl.len().alias("ops"))
    pairs = pairs.with_columns((pl.col("busbw_gbps") / pl.col("busbw_gbps").median().over("job_id", "size_bytes")).alias("ratio"))
    if "host" in p.columns:
        hosts = p.group_by("job_id", "rank").agg(pl.col("host").drop_nulls().first())
        pairs = pairs.join(hosts, on=["job_id", "rank"], how="left").join(
            hosts.rename({"rank": "peer", "host": "peer_host"}), on=["job_id", "peer"], how="left")
    return pairs.with_columns(((pl.col("ratio") < threshold) & (pl.col("ops") >= min_ops)).alias("slow")).sort("ratio")


# --- regressions ------------------------------------------------------------------------------------------


def nccl_test_regressions(nccl_test: pl.DataFrame, *, min_size_bytes: int = 1 << 26, drop_ratio: float = 0.1) -> pl.DataFrame:
    """Each nccl-tests run against the earlier runs of the same benchmark (op, rank count, hosts).

    Per run and size ≥ ``min_size_bytes``: baseline = the median busbw of earlier runs at that size (both
    placements); the run's ``ratio`` is the median over sizes of busbw / baseline. ``regression`` when the
    ratio is below 1 − ``drop_ratio``. Runs need ``ts`` (nccl-tests prints no zone, so ingest stamps it)."""
    require_columns(nccl_test, "nccl_test", ("run_id", "op", "size_bytes", "busbw_gbps", "ts"))
    d = _canon_ops(nccl_test.filter(pl.col("size_bytes") >= min_size_bytes))
    if d.get_column("ts").null_count():
        raise ValidationError("a run without a timestamp cannot be ordered", frame="nccl_test", field="ts")
    key = ["op_canonical"] + [c for c in ("nranks", "hosts") if c in d.columns]
    d = d.with_columns([pl.col(c).cast(pl.String).fill_null("") for c in key if c != "op_canonical"])
    runs = d.group_by(*key, "run_id").agg(pl.col("ts").min().alias("ts")).sort("ts")
    rows = []
    for _, series in runs.group_by(key, maintain_order=True):
        seen: list[str] = []
        for run_id, ts in series.select("run_id", "ts").iter_rows():
            cur = d.filter(pl.col("run_id") == run_id)
            ratio = None
            if seen:
                base = d.filter(pl.col("run_id").is_in(seen)).group_by("size_bytes").agg(pl.col("busbw_gbps").median().alias("base"))
                per_size = cur.group_by("size_bytes").agg(pl.col("busbw_gbps").median()).join(base, on="size_bytes")
                per_size = per_size.filter(pl.col("base") > 0)
                if per_size.height:
                    ratio = float((per_size["busbw_gbps"] / per_size["base"]).median())
            rows.append({"run_id": run_id, "ts": ts, "op": cur["op_canonical"][0],
                         "hosts": cur["hosts"][0] if "hosts" in cur.columns else None,
                         "busbw_gbps": float(cur["busbw_gbps"].median()), "baseline_runs": len(seen), "ratio": ratio,
                         "regression": ratio is not None and ratio < 1 - drop_ratio})
            seen.append(run_id)
    return pl.DataFrame(rows, schema={"run_id": pl.String, "ts": UTC_US, "op": pl.String, "hosts": pl.String, "busbw_gbps": pl.Float64,
                                      "baseline_runs": pl.Int64, "ratio": pl.Float64, "regression": pl.Boolean})


# --- all-to-all and bisection ------------------------------------------------------------------------------


def alltoall_bound_gbps(nranks: int, bisection_gbps: float, link_gbps: float | None = None) -> dict[str, float]:
    """Upper bounds on all-to-all algbw and busbw (GB/s, nccl-tests' definitions) for ``nranks`` ranks on a
    fabric with ``bisection_gbps`` across its narrowest cut in each direction and, optionally, ``link_gbps``
    per rank: algbw ≤ min(4B/n, b·n/(n−1)); busbw = algbw·(n−1)/n. ``limit`` says which bound binds."""
    if nranks < 2:
        raise ValueError("all-to-all needs at least 2 ranks")
    if not bisection_gbps > 0:
        raise ValueError("bisection bandwidth must be positive")
    bis = 4 * bisection_gbps / nranks
    inj = math.inf if link_gbps is None else link_gbps * nranks / (nranks - 1)
    alg = min(bis, inj)
    return {"algbw_gbps": alg, "busbw_gbps": alg * (nranks - 1) / nranks, "bisection_algbw_gbps": bis,
            "injection_algbw_gbps": inj, "limit": "bisection" if bis <= inj else "injection"}


def alltoall_bisection_utilization(df: pl.DataFrame, bisection_gbps: float, *, nranks: int | None = None,
                                   link_gbps: float | None = None) -> pl.DataFrame:
    """All-to-all rows (nccl_test or collective) with the bound for their rank count and how close they came."""
    require_columns(df, "frame", ("op", "algbw_gbps"))
    d = _canon_ops(df).filter(pl.col("op_canonical") == "alltoall")
    if nranks is None:
        require_columns(d, "frame", ("nranks",))
    ns = [nranks] * d.height if nranks is not None else d.get_column("nranks").to_list()
    bounds = [alltoall_bound_gbps(int(n), bisection_gbps, link_gbps)["algbw_gbps"] if n and n >= 2 else None for n in ns]
    return d.with_columns(pl.Series("bound_algbw_gbps", bounds, dtype=pl.Float64)).with_columns(
        (pl.col("algbw_gbps") / pl.col("bound_algbw_gbps")).alias("bound_ratio"))


# --- findings ---------------------------------------------------------------------------------------------


def fabric_findings(*, members: pl.DataFrame | None = None, member_kind: str = "host", links: pl.DataFrame | None = None,
                    regressions: pl.DataFrame | None = None, window_start: datetime, window_end: datetime) -> pl.DataFrame:
    """Findings for slow members (``slow_members`` output; ``member_kind`` host or rank), slow links and
    nccl-tests regressions. A regression's window is its run's own time, not the sweep's: re-running the
    sweep then updates one finding per run (the ``finding`` key) instead of making a new one every time,
    so an alert on it ends once the run is older than the rule's lookback."""
    rows = []
    if members is not None:
        for r in members.filter("slow").to_dicts():
            subject = f"host:{r['member']}" if member_kind == "host" else f"rank:{r['member']}"
            rows.append({"analyzer": "fabric", "kind": f"slow_{member_kind}", "subject": subject, "score": float(r["score"]),
                         "severity": "warning" if r["innocent_groups"] == 0 else "info",
                         "summary": f"{subject} is in {r['groups']} collective groups running at a median {r['score']:.0%} of their peers' bus bandwidth.",
                         "evidence": r})
    if links is not None:
        for r in links.filter("slow").to_dicts():
            a = r.get("host") or f"rank {r['rank']}"
            b = r.get("peer_host") or f"rank {r['peer']}"
            rows.append({"analyzer": "fabric", "kind": "slow_link", "subject": f"job:{r['job_id']}/link:{r['rank']}->{r['peer']}",
                         "score": float(r["ratio"]), "severity": "warning",
                         "summary": f"Link {a} → {b} moves {r['size_bytes']}-byte messages at {r['ratio']:.0%} of the job's median pair.",
                         "evidence": r})
    if regressions is not None:
        for r in regressions.filter("regression").to_dicts():
            rows.append({"analyzer": "fabric", "kind": "nccl_test_regression", "subject": f"nccl_test:{r['run_id']}",
                         "score": float(r["ratio"]), "severity": "warning",
                         "summary": f"nccl-tests {r['op']} on {r['hosts'] or 'its hosts'} ran at {r['ratio']:.0%} of its baseline "
                                    f"over {r['baseline_runs']} earlier run(s).",
                         "evidence": r, "window_start": r["ts"], "window_end": r["ts"]})
    for r in rows:
        r.setdefault("window_start", window_start)
        r.setdefault("window_end", window_end)
        r["evidence"] = json.dumps(r["evidence"], default=str, sort_keys=True)
    return findings_frame(rows)
