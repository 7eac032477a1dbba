"""Absence: GPUs, hosts and sites that stop reporting.

A metric that stops arriving raises nothing in a threshold rule: there is no value to compare. Prometheus
answers this with ``absent()`` and with its staleness rule (a series missing for five minutes is gone); the
Google SRE book's "Monitoring Distributed Systems" lists it as the first thing a page should cover — a dead
host is silent, not out of range. Here a member is absent when its last sample is older than
``missed_intervals`` of its own sampling interval (and at least ``min_silence_s``), measured against the
fleet's newest sample rather than the wall clock, so data that arrives late or is replayed (an agent
catching up from its buffer, a backfill) does not make every host look dead; a host is down when every GPU
it reported is absent. A site is silent when its own newest sample is that old by the wall clock (the whole
site, or the whole fleet, stopped), or when most of its hosts fall silent together: a collector, network
path or the ingest failing is then far likelier than dozens of hosts dying in the same minute, so the one
finding is about the site (one fault, one page).

Pure: a frame of last-seen times in, findings out; the caller owns the clock and says what "now" is.
"""

from __future__ import annotations

import json
from datetime import datetime

import polars as pl

from fleetscope.core.frames import findings_frame, require_columns

KINDS = ("gpu_absent", "host_down", "site_silent")
"""Finding kinds this module emits (matched by the default rules GpuStoppedReporting, HostDown and
TelemetryAbsent)."""


def last_seen(gpu_sample: pl.DataFrame, gpu_host: pl.DataFrame | None = None) -> pl.DataFrame:
    """Per GPU: ``last_ts``, ``interval_s`` (median spacing of its samples; null with one sample) and
    ``host`` (from the samples' GPU inventory ``gpu_host`` when given)."""
    require_columns(gpu_sample, "gpu_sample", ("ts", "gpu_uuid"))
    out = (gpu_sample.select("gpu_uuid", "ts").unique().sort("gpu_uuid", "ts")
           .group_by("gpu_uuid", maintain_order=True)
           .agg(pl.col("ts").max().alias("last_ts"),
                (pl.col("ts").diff().dt.total_microseconds().median() / 1e6).alias("interval_s")))
    if gpu_host is not None and gpu_host.height:
        out = out.join(gpu_host.select("gpu_uuid", "host").unique("gpu_uuid"), on="gpu_uuid", how="left")
    else:
        out = out.with_columns(pl.lit(None, pl.String).alias("host"))
    return out


def absence_findings(seen: pl.DataFrame, *, now: datetime, host_site: pl.DataFrame | None = None,
                     missed_intervals: float = 3.0, min_silence_s: float = 120.0, default_interval_s: float = 10.0,
                     collapse_share: float = 0.5, collapse_min_hosts: int = 4) -> pl.DataFrame:
    """Findings for absent GPUs (``gpu_absent``, warning) and hosts all of whose GPUs are absent
    (``host_down``, critical), both against the fleet's newest sample; and silent sites (``site_silent``,
    critical): a site whose newest sample is past its limit by the wall clock ``now``, or where at least
    ``collapse_share`` of at least ``collapse_min_hosts`` reporting hosts went silent (replacing those hosts'
    findings).

    ``seen``: gpu_uuid, host, last_ts, interval_s (as :func:`last_seen` makes, possibly carried forward from
    earlier windows). A finding's ``window_start`` is the last sample seen, so re-running while the silence
    lasts updates the same finding (the ``finding`` frame's key) and moves its ``window_end`` to ``now``.
    """
    require_columns(seen, "last_seen", ("gpu_uuid", "host", "last_ts", "interval_s"))
    if seen.height == 0:
        return findings_frame([])
    newest = seen["last_ts"].max()
    ref = min(now, newest) if newest is not None else now
    limit_s = pl.max_horizontal(pl.col("interval_s").fill_null(default_interval_s) * missed_intervals, pl.lit(min_silence_s))
    silent_s = (pl.lit(ref) - pl.col("last_ts")).dt.total_microseconds() / 1e6
    s = seen.with_columns(silent_s.alias("silent_s"), limit_s.alias("limit_s")).with_columns(
        (pl.col("silent_s") > pl.col("limit_s")).alias("absent"))
    if host_site is not None and host_site.height:
        s = s.join(host_site.select("host", "site_id").unique("host"), on="host", how="left")
    else:
        s = s.with_columns(pl.lit(None, pl.String).alias("site_id"))
    # a whole site quiet by the wall clock: its newest sample is past the limit of its slowest member
    wall = (s.filter(pl.col("site_id").is_not_null()).group_by("site_id")
            .agg(pl.col("last_ts").max(), pl.col("limit_s").max(), pl.col("host").n_unique().alias("hosts"))
            .with_columns(((pl.lit(now) - pl.col("last_ts")).dt.total_microseconds() / 1e6).alias("silent_s"))
            .filter(pl.col("silent_s") > pl.col("limit_s")))
    hosts = (s.filter(pl.col("host").is_not_null())
             .group_by("host").agg(pl.col("site_id").first(), pl.col("absent").all().alias("down"), pl.len().alias("gpus"),
                                   pl.col("last_ts").max().alias("last_ts"), pl.col("silent_s").min().alias("silent_s"),
                                   pl.col("limit_s").max().alias("limit_s")))
    sites = (hosts.filter(pl.col("site_id").is_not_null()).group_by("site_id")
             .agg(pl.len().alias("hosts"), pl.col("down").sum().alias("down_hosts"), pl.col("last_ts").max().alias("last_ts"),
                  pl.col("host").filter(pl.col("down")).sort().alias("down_list"))
             .filter((pl.col("hosts") >= collapse_min_hosts) & (pl.col("down_hosts") >= collapse_share * pl.col("hosts"))))
    collapsed = set(sites["site_id"].to_list())
    rows: list[dict] = []
    for r in wall.filter(~pl.col("site_id").is_in(list(collapsed))).sort("site_id").to_dicts():
        rows.append(_row("site_silent", f"site:{r['site_id']}", r["last_ts"], now, "critical", r["silent_s"],
                         f"Site {r['site_id']} sent nothing for {r['silent_s']:.0f} s ({r['hosts']} hosts): suspect the collectors, "
                         "their network path or the ingest before the hosts.",
                         {"hosts": r["hosts"], "silent_s": r["silent_s"], "limit_s": r["limit_s"], "basis": "wall clock"}))
    for r in sites.sort("site_id").to_dicts():
        rows.append(_row("site_silent", f"site:{r['site_id']}", r["last_ts"], now, "critical", r["down_hosts"] / r["hosts"],
                         f"{r['down_hosts']} of {r['hosts']} hosts of site {r['site_id']} stopped reporting together: "
                         "suspect the collectors, their network path or the ingest before the hosts.",
                         {"hosts": r["hosts"], "down_hosts": r["down_hosts"], "down": r["down_list"][:50]}))
    down_hosts = hosts.filter(pl.col("down") & ~pl.col("site_id").is_in(list(collapsed)).fill_null(False))
    for r in down_hosts.sort("host").to_dicts():
        rows.append(_row("host_down", f"host:{r['host']}", r["last_ts"], now, "critical", r["silent_s"],
                         f"Host {r['host']} sent nothing for {r['silent_s']:.0f} s (all {r['gpus']} GPUs silent; "
                         f"limit {r['limit_s']:.0f} s).",
                         {"gpus": r["gpus"], "silent_s": r["silent_s"], "limit_s": r["limit_s"], "site_id": r["site_id"]}))
    gone = set(down_hosts["host"].to_list()) | set(hosts.filter(pl.col("site_id").is_in(list(collapsed)) & pl.col("down"))["host"].to_list())
    lone = s.filter(pl.col("absent") & ~pl.col("host").is_in(list(gone)).fill_null(False))
    for r in lone.sort("gpu_uuid").to_dicts():
        where = f" on {r['host']}" if r["host"] else ""
        rows.append(_row("gpu_absent", f"gpu:{r['gpu_uuid']}", r["last_ts"], now, "warning", r["silent_s"],
                         f"GPU {r['gpu_uuid']}{where} stopped reporting {r['silent_s']:.0f} s ago while its host still reports "
                         "(fallen off the bus, or the exporter lost it).",
                         {"host": r["host"], "silent_s": r["silent_s"], "limit_s": r["limit_s"], "interval_s": r["interval_s"]}))
    return findings_frame(rows)


def _row(kind: str, subject: str, last_ts: datetime, now: datetime, severity: str, score: float, summary: str,
         evidence: dict) -> dict:
    return {"analyzer": "absence", "kind": kind, "subject": subject, "window_start": last_ts, "window_end": now,
            "severity": severity, "score": float(score), "summary": summary,
            "evidence": json.dumps(evidence, default=str, sort_keys=True)}


SEEN_SCHEMA = {"gpu_uuid": pl.String, "host": pl.String, "last_ts": pl.Datetime("us", "UTC"), "interval_s": pl.Float64}


def carried(findings: pl.DataFrame, gpu_host: pl.DataFrame, host_site: pl.DataFrame | None = None) -> pl.DataFrame:
    """Last-seen rows rebuilt from open absence findings, so a member silent for longer than the window a
    sweep reads stays absent: a ``gpu_absent`` GPU, every inventory GPU of a ``host_down`` host and of the
    hosts of a ``site_silent`` site, each last seen at its finding's ``window_start``. The caller drops
    the GPUs that report again."""
    if findings.height == 0:
        return pl.DataFrame(schema=SEEN_SCHEMA)
    rows: list[dict] = []
    inv = gpu_host.select("gpu_uuid", "host").unique("gpu_uuid")
    hs = host_site.select("host", "site_id").unique("host") if host_site is not None and host_site.height else pl.DataFrame(schema={"host": pl.String, "site_id": pl.String})
    for r in findings.filter(pl.col("kind").is_in(list(KINDS))).sort("window_start").to_dicts():
        what, _, name = r["subject"].partition(":")
        ev = json.loads(r["evidence"] or "{}")
        if r["kind"] == "gpu_absent":
            rows.append({"gpu_uuid": name, "host": ev.get("host"), "last_ts": r["window_start"], "interval_s": ev.get("interval_s")})
            continue
        hosts = [name] if r["kind"] == "host_down" else hs.filter(pl.col("site_id") == name)["host"].to_list()
        for g, h in inv.filter(pl.col("host").is_in(hosts)).iter_rows():
            rows.append({"gpu_uuid": g, "host": h, "last_ts": r["window_start"], "interval_s": None})
    # a GPU under several open findings keeps its latest last-seen time
    return pl.DataFrame(rows, schema=SEEN_SCHEMA).sort("last_ts").unique("gpu_uuid", keep="last")
