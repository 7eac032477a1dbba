"""Saturation of serving replicas, from their gauges and counters over a window.

* ``kv_cache_saturated`` — the KV cache is near full **and** requests wait: a replica whose
  ``kv_cache_usage_ratio`` ≥ ``kv_full_ratio`` while ``requests_waiting`` > 0 in at least ``min_share`` of the
  window's scrapes. A full cache alone is a well-used one (vLLM allocates it up front and fills it);
  waiting requests alone may be a queue in front of a cache with room, which is a scheduler or batch-size
  limit, not memory. Both together mean new requests cannot be admitted because there is no room for
  their KV blocks (vLLM's scheduler, "Efficient Memory Management for Large Language Model Serving with
  PagedAttention", Kwon et al., SOSP 2023, §4.5: when blocks run out, requests wait or are preempted).
* ``preemptions_climbing`` — ``preemptions_total`` rose in the window at more than ``min_preemptions_per_min``
  and faster than in the window before (the same length): running requests are being evicted to make room,
  and their recomputation costs the throughput the cache was meant to buy (PagedAttention §4.5).

Pure: frames in, findings out (``fleetscope.core.frames.findings_frame``); windows passed in.
"""

from __future__ import annotations

import datetime as dt
import json

import polars as pl

from analyzers.serving_latency import SERIES, counter_increase
from fleetscope.core.frames import findings_frame, require_columns

KINDS = ("kv_cache_saturated", "preemptions_climbing")


def _scrapes(gauges: pl.DataFrame, start: dt.datetime, end: dt.datetime) -> pl.DataFrame:
    """Per replica and scrape: KV use (max over its engines) and waiting requests (summed)."""
    w = gauges.filter((pl.col("ts") >= start) & (pl.col("ts") <= end))
    kv = (w.filter(pl.col("metric") == "kv_cache_usage_ratio").group_by("deployment", "replica", "ts")
          .agg(pl.col("value").max().alias("kv")))
    waiting = (w.filter(pl.col("metric") == "requests_waiting").group_by("deployment", "replica", "ts")
               .agg(pl.col("value").sum().alias("waiting")))
    return kv.join(waiting, on=["deployment", "replica", "ts"], how="inner")


def saturation_findings(gauges: pl.DataFrame, counters: pl.DataFrame | None, *, start: dt.datetime, end: dt.datetime,
                        kv_full_ratio: float = 0.9, min_share: float = 0.5, min_preemptions_per_min: float = 1.0) -> pl.DataFrame:
    """``kv_cache_saturated`` and ``preemptions_climbing`` findings per replica in ``[start, end]``."""
    require_columns(gauges, "serving_gauge", ("ts", *SERIES, "value"))
    rows = []
    s = _scrapes(gauges, start, end)
    if s.height:
        per = (s.group_by("deployment", "replica")
               .agg(pl.len().alias("scrapes"),
                    ((pl.col("kv") >= kv_full_ratio) & (pl.col("waiting") > 0)).sum().alias("saturated"),
                    pl.col("kv").max().alias("kv_max"), pl.col("waiting").max().alias("waiting_max"))
               .with_columns((pl.col("saturated") / pl.col("scrapes")).alias("share"))
               .filter(pl.col("share") >= min_share).sort("deployment", "replica"))
        for r in per.iter_rows(named=True):
            rows.append({
                "analyzer": "serving_saturation", "kind": "kv_cache_saturated",
                "subject": f"deployment:{r['deployment']}/replica:{r['replica']}", "window_start": start, "window_end": end,
                "severity": "critical" if r["share"] >= 0.9 else "warning", "score": float(r["share"]),
                "summary": (f"Replica {r['replica']} of {r['deployment']}: KV cache at or above {kv_full_ratio:.0%} with requests "
                            f"waiting in {r['saturated']} of {r['scrapes']} scrapes (peak {r['kv_max']:.0%} used, "
                            f"{r['waiting_max']:.0f} waiting): requests queue for cache room."),
                "evidence": json.dumps({"scrapes": r["scrapes"], "saturated_scrapes": r["saturated"], "kv_max_ratio": r["kv_max"],
                                        "waiting_max": r["waiting_max"], "kv_full_ratio": kv_full_ratio}),
            })
    if counters is not None and counters.height:
        require_columns(counters, "serving_counter", ("ts", *SERIES, "value"))
        span = end - start
        p = counters.filter(pl.col("metric") == "preemptions_total").sort("ts")

        def per_min(lo: dt.datetime, hi: dt.datetime) -> dict[tuple[str, str], float]:
            w = p.filter((pl.col("ts") >= lo) & (pl.col("ts") <= hi))
            out: dict[tuple[str, str], float] = {}
            for (dep, rep), g in w.group_by("deployment", "replica", maintain_order=True):
                inc = sum(counter_increase(x["value"].to_list()) for _, x in g.group_by(list(SERIES), maintain_order=True))
                out[(dep, rep)] = out.get((dep, rep), 0.0) + inc / (span.total_seconds() / 60)
            return out

        now_rate, before = per_min(start, end), per_min(start - span, start)
        for (dep, rep), rate in sorted(now_rate.items()):
            prev = before.get((dep, rep), 0.0)
            if rate > min_preemptions_per_min and rate > prev:
                rows.append({
                    "analyzer": "serving_saturation", "kind": "preemptions_climbing", "subject": f"deployment:{dep}/replica:{rep}",
                    "window_start": start, "window_end": end, "severity": "warning", "score": float(rate),
                    "summary": (f"Replica {rep} of {dep} preempts {rate:.1f} requests/min, up from {prev:.1f} in the window "
                                "before: running requests are evicted for KV room and recomputed."),
                    "evidence": json.dumps({"preemptions_per_min": rate, "previous_per_min": prev, "window_s": span.total_seconds()}),
                })
    return findings_frame(rows)
