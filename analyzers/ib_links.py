"""InfiniBand / RoCE link health from port counters and topology: error and congestion rates from counter
deltas, flapping links, width- or speed-degraded links, and the per-link peak the topology implies.

Counters (``fabric_port_sample``) are cumulative. Per port, consecutive samples give deltas:

- a counter that went down was reset (``perfquery -R``, a reboot, a driver reload): the delta is the new
  value, counted from zero, as Prometheus' ``increase()`` does;
- IBTA PortCounters *saturate*: they stop at their maximum instead of wrapping (InfiniBand Architecture
  Specification vol. 1, 16.1.3.5, "counters ... shall not wrap"). A legacy counter that reads its
  maximum (``SATURATED``: 2^32-1 for PortXmitWait and the data and packet counters, 2^16-1 for
  SymbolErrorCounter, ...) has stopped counting, so an interval that starts or ends on it has no
  delta: it is reported as saturated, never as a rate of zero or of four billion.

Thresholds, per port over the window:

- ``ib_link_flapping``: LinkDownedCounter rose: the link failed its error recovery and went down
  (IBTA 16.1.3.5); critical from ``flap_critical`` downs;
- ``ib_link_errors``: symbol-error bit error rate above 1e-12, the default BER threshold of NVIDIA's
  ``ibdiagnet`` (``--ber_thresh``, "default threshold=10^-12"), with the bits a link carries taken as its
  rate times the interval; or increments of any other error counter at or above the per-counter
  thresholds infiniband-diags' ``ibcheckerrs`` ships (``ibcheckerrs -s``: SymbolErrorCounter,
  LinkErrorRecoveryCounter, PortRcvErrors, LocalLinkIntegrityErrors, ExcessiveBufferOverrunErrors 10;
  PortRcvRemotePhysicalErrors, PortRcvSwitchRelayErrors, PortXmitConstraintErrors,
  PortRcvConstraintErrors, VL15Dropped 100), applied to the window's increase rather than to the
  counter since its last reset; or RDMA transport errors (mlx5 ``hw_counters``): any
  ``local_ack_timeout_err`` (the requester gave up waiting for an ACK: a packet was lost) or at least
  ``retrans_threshold`` ``roce_adp_retrans``;
- ``ib_congestion``: PortXmitDiscards at or above 100 (ibcheckerrs) in the window, or an xmit-wait ratio
  above ``wait_ratio_threshold``. PortXmitWait counts ticks in which the port had data to send and sent
  none (IBTA 16.1.3.5); the tick is device-defined, so the ratio used is wait ticks over wait ticks plus
  4-octet words sent, a share of transmit opportunities lost to back-pressure that needs no tick length.
  It is a heuristic, and its threshold a setting;
- ``ib_link_degraded``: an active link narrower than the links of its class (HCA-to-switch,
  switch-to-switch, or the ports' link layer) mostly are, from the topology (``ibnetdiscover``) and from
  the ports' own rate (sysfs ``4X EDR``), e.g. a 1X link among 4X ones; or, in the topology, slower than
  the other links of the same switch mostly are (a switch runs all its ports at one generation's speed,
  so an EDR link on an HDR switch trained down; an older QDR HCA elsewhere in the fleet is not degraded).
  Ports with no peer are not links.

Pure: polars frames in, polars frames out.
"""

from __future__ import annotations

import json
from datetime import datetime

import polars as pl

from fleetscope.core.frames import findings_frame, require_columns

__all__ = [
    "SATURATED", "ERROR_THRESHOLDS", "BER_THRESHOLD", "port_deltas", "port_health", "degraded_links",
    "nic_link_rate_gbps", "link_findings",
]

# Largest value of each counter as PortCounters holds it (IBTA vol. 1, table "PortCounters"): a legacy
# counter at this value has saturated.
SATURATED: dict[str, int] = {
    "xmit_bytes_total": (2**32 - 1) * 4, "rcv_bytes_total": (2**32 - 1) * 4,
    "xmit_packets_total": 2**32 - 1, "rcv_packets_total": 2**32 - 1, "xmit_wait_total": 2**32 - 1,
    "symbol_errors_total": 2**16 - 1, "link_error_recovery_total": 2**8 - 1, "link_downed_total": 2**8 - 1,
    "rcv_errors_total": 2**16 - 1, "rcv_remote_physical_errors_total": 2**16 - 1, "rcv_switch_relay_errors_total": 2**16 - 1,
    "xmit_discards_total": 2**16 - 1, "xmit_constraint_errors_total": 2**8 - 1, "rcv_constraint_errors_total": 2**8 - 1,
    "local_link_integrity_errors_total": 2**4 - 1, "excessive_buffer_overrun_errors_total": 2**4 - 1, "vl15_dropped_total": 2**16 - 1,
}
# ibcheckerrs' thresholds, applied to the window's increase
ERROR_THRESHOLDS: dict[str, int] = {
    "symbol_errors_total": 10, "link_error_recovery_total": 10, "rcv_errors_total": 10, "local_link_integrity_errors_total": 10,
    "excessive_buffer_overrun_errors_total": 10, "rcv_remote_physical_errors_total": 100, "rcv_switch_relay_errors_total": 100,
    "xmit_constraint_errors_total": 100, "rcv_constraint_errors_total": 100, "vl15_dropped_total": 100,
}
DISCARD_THRESHOLD = 100
BER_THRESHOLD = 1e-12
RDMA_COUNTERS = ("roce_adp_retrans_total", "local_ack_timeout_err_total", "out_of_buffer_total", "packet_seq_err_total")
COUNTERS = tuple(dict.fromkeys((*SATURATED, *RDMA_COUNTERS)))
PORT_KEY = ["node", "device", "port"]
_LANES = {"1X": 1, "2X": 2, "4X": 4, "8X": 8, "12X": 12}
_SPEED_RANK = {"SDR": 0, "DDR": 1, "QDR": 2, "FDR10": 3, "FDR": 4, "EDR": 5, "HDR": 6, "NDR": 7, "XDR": 8}


def port_deltas(samples: pl.DataFrame) -> pl.DataFrame:
    """Per port and interval between consecutive samples: ``interval_s``, one ``d_<counter>`` per counter
    (null where either end is missing or saturated), ``resets`` (counters that went down) and
    ``saturated`` (counters at their maximum at either end)."""
    require_columns(samples, "fabric_port_sample", ("ts", *PORT_KEY))
    have = [c for c in COUNTERS if c in samples.columns]
    # Sorted by port then time, the previous row is the port's previous sample wherever the key repeats:
    # one comparison instead of a windowed shift per counter (port_health on 16,384 ports: 3.1 s -> 0.6 s).
    s = samples.select("ts", *PORT_KEY, *have).sort(*PORT_KEY, "ts")
    same = pl.all_horizontal([pl.col(k) == pl.col(k).shift(1) for k in PORT_KEY]).fill_null(False)
    s = s.with_columns(same.alias("_same"))
    prev = {c: pl.when(pl.col("_same")).then(pl.col(c).shift(1)) for c in have}
    exprs = [pl.when(pl.col("_same")).then((pl.col("ts") - pl.col("ts").shift(1)).dt.total_microseconds() / 1e6).alias("interval_s")]
    resets, sats = [], []
    for c in have:
        cur, before = pl.col(c), prev[c]
        sat = (cur == SATURATED[c]) | (before == SATURATED[c]) if c in SATURATED else pl.lit(False)
        reset = cur < before
        exprs.append(pl.when(sat).then(None).when(reset).then(cur).otherwise(cur - before).alias(f"d_{c}"))
        resets.append(reset.fill_null(False).cast(pl.Int32))
        sats.append(pl.when(sat.fill_null(False)).then(pl.lit(c)).otherwise(None))
    exprs.append(pl.sum_horizontal(resets).alias("resets") if resets else pl.lit(0).alias("resets"))
    exprs.append(pl.concat_list(sats).list.drop_nulls().alias("saturated") if sats else pl.lit([], pl.List(pl.String)).alias("saturated"))
    return s.with_columns(exprs).filter(pl.col("interval_s") > 0).select("ts", *PORT_KEY, "interval_s", *[f"d_{c}" for c in have], "resets", "saturated")


def port_health(samples: pl.DataFrame, *, wait_ratio_threshold: float = 0.1, retrans_threshold: int = 100,
                flap_critical: int = 3) -> pl.DataFrame:
    """One row per port with at least two samples: the window's increases, rates and verdicts
    (``flapping``, ``errors``, ``congested`` and the ``reasons`` for them)."""
    require_columns(samples, "fabric_port_sample", ("ts", *PORT_KEY))
    d = port_deltas(samples)
    have = [c for c in COUNTERS if f"d_{c}" in d.columns]
    agg = d.group_by(PORT_KEY).agg(
        pl.col("interval_s").sum().alias("seconds"),
        # all intervals unknown (saturated, missing) is unknown, not zero
        *[pl.when(pl.col(f"d_{c}").is_not_null().any()).then(pl.col(f"d_{c}").sum()).alias(c.removesuffix("_total")) for c in have],
        *[pl.col(f"d_{c}").is_null().sum().alias(f"_{c}_gaps") for c in have if c in SATURATED],
        pl.col("resets").sum().alias("resets"),
        pl.col("saturated").list.explode(keep_nulls=False, empty_as_null=False).unique().sort().alias("saturated"),
    )
    info_cols = [c for c in ("host", "node_guid", "lid", "rate_gbps", "width", "speed", "state", "link_layer") if c in samples.columns]
    last = samples.sort("ts").group_by(PORT_KEY).agg(*[pl.col(c).drop_nulls().last() for c in info_cols], pl.col("ts").max().alias("last_ts"))
    h = agg.join(last, on=PORT_KEY, how="left")
    for c in ("rate_gbps",):
        if c not in h.columns:
            h = h.with_columns(pl.lit(None, pl.Float64).alias(c))

    def col(name: str) -> pl.Expr:
        return pl.col(name) if name in h.columns else pl.lit(None, pl.Int64)

    secs = pl.col("seconds")
    words = col("xmit_bytes") / 4
    h = h.with_columns(
        (col("xmit_bytes") * 8 / secs / 1e9).alias("xmit_gbps"),
        (col("rcv_bytes") * 8 / secs / 1e9).alias("rcv_gbps"),
        # 0/0 (an idle port) is no ratio at all, and NaN would compare above every threshold
        (col("symbol_errors") / (pl.col("rate_gbps") * 1e9 * secs)).fill_nan(None).alias("symbol_ber"),
        (col("xmit_wait") / (col("xmit_wait") + words)).fill_nan(None).alias("xmit_wait_ratio"),
    )
    h = h.with_columns(
        (col("link_downed").fill_null(0) > 0).alias("flapping"),
        pl.concat_list(
            [pl.when(pl.col("symbol_ber") > BER_THRESHOLD).then(pl.lit("symbol BER above 1e-12")).otherwise(None),
             *[pl.when(col(c.removesuffix("_total")) >= t).then(pl.lit(f"{c.removesuffix('_total')} >= {t}")).otherwise(None)
               for c, t in ERROR_THRESHOLDS.items()],
             pl.when(col("local_ack_timeout_err") > 0).then(pl.lit("local_ack_timeout_err > 0")).otherwise(None),
             pl.when(col("roce_adp_retrans") >= retrans_threshold).then(pl.lit(f"roce_adp_retrans >= {retrans_threshold}")).otherwise(None)]
        ).list.drop_nulls().alias("error_reasons"),
        pl.concat_list(
            [pl.when(col("xmit_discards") >= DISCARD_THRESHOLD).then(pl.lit(f"xmit_discards >= {DISCARD_THRESHOLD}")).otherwise(None),
             pl.when(pl.col("xmit_wait_ratio") > wait_ratio_threshold).then(pl.lit(f"xmit_wait_ratio > {wait_ratio_threshold:g}")).otherwise(None)]
        ).list.drop_nulls().alias("congestion_reasons"),
    ).with_columns(
        (pl.col("error_reasons").list.len() > 0).alias("errors"),
        (pl.col("congestion_reasons").list.len() > 0).alias("congested"),
        pl.when(col("link_downed").fill_null(0) >= flap_critical).then(pl.lit("critical")).otherwise(pl.lit("warning")).alias("flap_severity"),
    )
    return h.drop([c for c in h.columns if c.startswith("_")]).sort(PORT_KEY)


def _lanes(width: pl.Expr) -> pl.Expr:
    return width.str.to_uppercase().replace_strict(_LANES, default=None, return_dtype=pl.Int64)


def _speed(speed: pl.Expr) -> pl.Expr:
    return speed.str.to_uppercase().replace_strict(_SPEED_RANK, default=None, return_dtype=pl.Int64)


def degraded_links(links: pl.DataFrame | None = None, ports: pl.DataFrame | None = None) -> pl.DataFrame:
    """Active links narrower or slower than the usual link of their class.

    ``links``: ``fabric_link`` rows (connected rows only are links; placement rows are skipped); class =
    the kinds of the two ends. ``ports``: ``fabric_port_sample`` rows (latest per port; ACTIVE ports with
    a width), one class per link layer. Returns subject, width, speed, rate_gbps and the class's usual
    width, speed and rate."""
    out = []
    schema = {"subject": pl.String, "host": pl.String, "width": pl.String, "speed": pl.String, "rate_gbps": pl.Float64,
              "expected_width": pl.String, "expected_speed": pl.String, "expected_rate_gbps": pl.Float64, "where": pl.String}
    if links is not None and links.height:
        require_columns(links, "fabric_link", ("a_node", "a_port", "b_node", "b_port", "a_kind", "b_kind", "width", "speed", "connected"))
        lk = links.filter(pl.col("connected").fill_null(False) & pl.col("b_port").is_not_null() & pl.col("width").is_not_null())
        lk = lk.with_columns(
            pl.concat_str([pl.col("a_kind").fill_null("?"), pl.col("b_kind").fill_null("?")], separator="-").alias("cls"),
            pl.concat_str([pl.col("a_desc").fill_null(pl.col("a_node")), pl.lit(":"), pl.col("a_port").cast(pl.String), pl.lit(" <-> "),
                           pl.col("b_desc").fill_null(pl.col("b_node")), pl.lit(":"), pl.col("b_port").cast(pl.String)]).alias("subject_text"),
            pl.col("a_host").alias("host") if "a_host" in lk.columns else pl.lit(None, pl.String).alias("host"),
        )
        out.append(_below_class(lk, "cls", speed_group="b_node").select(
            pl.concat_str([pl.lit("ib-link:"), pl.col("a_node"), pl.lit("/"), pl.col("a_port").cast(pl.String)]).alias("subject"),
            "host", "width", "speed", "rate_gbps", "expected_width", "expected_speed", "expected_rate_gbps",
            pl.col("subject_text").alias("where")))
    if ports is not None and ports.height and "width" in ports.columns:
        p = ports.sort("ts").group_by(PORT_KEY).agg(pl.all().drop_nulls().last())
        if "state" in p.columns:
            p = p.filter(pl.col("state").is_null() | (pl.col("state") == "ACTIVE"))
        p = p.filter(pl.col("width").is_not_null()).with_columns(
            (pl.col("link_layer").fill_null("InfiniBand") if "link_layer" in p.columns else pl.lit("InfiniBand")).alias("cls"),
            (pl.col("host") if "host" in p.columns else pl.lit(None, pl.String)).alias("host"))
        out.append(_below_class(p, "cls").select(
            _port_subject().alias("subject"), "host", "width", "speed", "rate_gbps", "expected_width", "expected_speed", "expected_rate_gbps",
            pl.concat_str([pl.col("node"), pl.lit(" "), pl.col("device"), pl.lit(" port "), pl.col("port").cast(pl.String)]).alias("where")))
    frames = [f.cast(schema) for f in out if f.height]  # type: ignore[arg-type]
    return pl.concat(frames) if frames else pl.DataFrame(schema=schema)


def _below_class(df: pl.DataFrame, cls: str, speed_group: str | None = None) -> pl.DataFrame:
    """Rows whose lanes are below the most common ones of their class (ties: the widest), or whose speed
    is below the most common one of their ``speed_group`` (ties: the fastest)."""
    if "speed" not in df.columns:
        df = df.with_columns(pl.lit(None, pl.String).alias("speed"))
    if "rate_gbps" not in df.columns:
        df = df.with_columns(pl.lit(None, pl.Float64).alias("rate_gbps"))
    d = df.with_columns(_lanes(pl.col("width")).alias("_lanes"), _speed(pl.col("speed")).alias("_speed"))
    mode_w = d.group_by(cls, "_lanes", "width").len().sort(["len", "_lanes"], descending=True).unique(cls, keep="first").select(
        cls, pl.col("_lanes").alias("_exp_lanes"), pl.col("width").alias("expected_width"))
    group = speed_group or cls
    mode_s = d.filter(pl.col("_speed").is_not_null()).group_by(group, "_speed", "speed").len().sort(["len", "_speed"], descending=True).unique(
        group, keep="first").select(group, pl.col("_speed").alias("_exp_speed"), pl.col("speed").alias("expected_speed"))
    d = d.join(mode_w, on=cls, how="left").join(mode_s, on=group, how="left")
    slower = (pl.col("_speed") < pl.col("_exp_speed")).fill_null(False) if speed_group else pl.lit(False)
    bad = d.filter((pl.col("_lanes") < pl.col("_exp_lanes")).fill_null(False) | slower)
    # what the link would carry at the expected width and speed
    lane = pl.col("rate_gbps") / pl.col("_lanes")
    exp_lane = pl.when(slower).then(None).otherwise(lane)
    return bad.with_columns((exp_lane * pl.col("_exp_lanes")).alias("expected_rate_gbps"),
                            pl.when(slower).then(pl.col("expected_speed")).otherwise(pl.col("speed")).alias("expected_speed"))


def _port_subject() -> pl.Expr:
    """host:<h>/ib:<device>:<port> for a host's HCA port, ib:<node>/<port> for a fabric-side one."""
    return (pl.when(pl.col("device") != "")
            .then(pl.concat_str([pl.lit("host:"), pl.col("node"), pl.lit("/ib:"), pl.col("device"), pl.lit(":"), pl.col("port").cast(pl.String)]))
            .otherwise(pl.concat_str([pl.lit("ib:"), pl.col("node"), pl.lit("/"), pl.col("port").cast(pl.String)])))


def nic_link_rate_gbps(links: pl.DataFrame | None = None, ports: pl.DataFrame | None = None) -> float | None:
    """The usual HCA link rate (Gb/s): the most common rate of connected HCA-to-switch links in the
    topology, else of the ports' own rates; None when neither knows. Divide by 8 for GB/s, the unit of
    NCCL's bus bandwidth: one 4X HDR HCA (200 Gb/s) moves at most 25 GB/s."""
    if links is not None and links.height and {"a_kind", "rate_gbps", "connected"} <= set(links.columns):
        r = links.filter(pl.col("connected").fill_null(False) & (pl.col("a_kind") == "CA")).get_column("rate_gbps").drop_nulls()
        if r.len():
            return float(r.mode().max())  # type: ignore[arg-type]
    if ports is not None and ports.height and "rate_gbps" in ports.columns:
        r = ports.get_column("rate_gbps").drop_nulls()
        if r.len():
            return float(r.mode().max())  # type: ignore[arg-type]
    return None


def link_findings(health: pl.DataFrame | None, degraded: pl.DataFrame | None = None, *, window_start: datetime,
                  window_end: datetime) -> pl.DataFrame:
    """Findings ``ib_link_flapping``, ``ib_link_errors``, ``ib_congestion`` (from ``port_health``) and
    ``ib_link_degraded`` (from ``degraded_links``), one per port or link."""
    rows: list[dict] = []
    if health is not None and health.height:
        h = health.with_columns(_port_subject().alias("subject"))
        keep = [c for c in ("host", "node_guid", "lid", "rate_gbps", "width", "speed", "state", "seconds", "link_downed", "link_error_recovery",
                            "symbol_errors", "symbol_ber", "rcv_errors", "xmit_discards", "xmit_wait", "xmit_wait_ratio", "xmit_gbps",
                            "rcv_gbps", "roce_adp_retrans", "local_ack_timeout_err", "out_of_buffer", "resets", "saturated",
                            "error_reasons", "congestion_reasons") if c in h.columns]
        for r in h.filter(pl.col("flapping") | pl.col("errors") | pl.col("congested")).to_dicts():
            ev = {k: r[k] for k in keep}
            where = f"{r['subject']}" + (f" on {r['host']}" if r.get("host") else "")
            if r["flapping"]:
                rows.append({"kind": "ib_link_flapping", "subject": r["subject"], "severity": r["flap_severity"], "score": float(r["link_downed"]),
                             "summary": f"InfiniBand link {where} went down {r['link_downed']} time(s) in {r['seconds']:.0f} s.", "evidence": ev})
            if r["errors"]:
                rows.append({"kind": "ib_link_errors", "subject": r["subject"], "severity": "warning",
                             "score": float(r["symbol_ber"]) if r.get("symbol_ber") is not None else None,
                             "summary": f"InfiniBand link {where} has errors: {', '.join(r['error_reasons'])} in {r['seconds']:.0f} s.", "evidence": ev})
            if r["congested"]:
                rows.append({"kind": "ib_congestion", "subject": r["subject"], "severity": "warning",
                             "score": float(r["xmit_wait_ratio"]) if r.get("xmit_wait_ratio") is not None else None,
                             "summary": f"InfiniBand port {where} is congested: {', '.join(r['congestion_reasons'])} in {r['seconds']:.0f} s.",
                             "evidence": ev})
    if degraded is not None and degraded.height:
        for r in degraded.to_dicts():
            rows.append({"kind": "ib_link_degraded", "subject": r["subject"], "severity": "warning",
                         "score": (r["rate_gbps"] / r["expected_rate_gbps"]) if r.get("rate_gbps") and r.get("expected_rate_gbps") else None,
                         "summary": f"InfiniBand link {r['where']} runs at {r['width']} {r['speed'] or ''} ({r['rate_gbps'] or '?'} Gb/s) where its "
                                    f"peers run {r['expected_width']} {r['expected_speed'] or ''} ({r['expected_rate_gbps'] or '?'} Gb/s).",
                         "evidence": r})
    for r in rows:
        r["analyzer"] = "fabric"
        r["window_start"], r["window_end"] = window_start, window_end
        r["evidence"] = json.dumps(r["evidence"], default=str, sort_keys=True)
    return findings_frame(rows)
