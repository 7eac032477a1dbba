"""Serving goodput as DistServe defines it: completed requests per second that meet both the
time-to-first-token and the time-per-output-token SLO (Zhong et al., "DistServe: Disaggregating Prefill and
Decoding for Goodput-optimized Large Language Model Serving", OSDI 2024, §2; the authors' post
"Throughput is Not All You Need", 2024: goodput is "the number of completed requests per second that
adheres to SLOs (TTFT and TPOT requirements)").

Two ways to know it, and the result says which (``method``):

* ``exact`` — from a request log (``serving_request``): each request's TTFT = first_token − arrival and
  TPOT = (finish − first_token) / (output_tokens − 1) (the per-request mean over the tokens after the first,
  as DistServe, vLLM's benchmark and NVIDIA AIPerf compute it; a request of one output token has no TPOT and
  is judged on TTFT alone). A request counts when it completed (``status`` ok, ``finish`` in the window)
  and meets both limits.
* ``bounded`` — from histograms, which count TTFTs and TPOTs separately and so cannot say which requests
  met both. With N completed requests (the end-to-end latency histogram's increase), A meeting TTFT and B
  meeting TPOT (read at the SLO thresholds; between the bucket bounds around them when a threshold is not a
  bound), the number meeting both lies in the Fréchet bounds [max(0, A + B − N), min(A, B)]. The TPOT side
  needs a per-request histogram (vLLM V1 ``request_time_per_output_token_seconds``, TGI
  ``request_mean_time_per_token_duration``); a per-token one (inter-token latency) counts tokens, not
  requests, so without a per-request histogram the lower bound is 0 and the upper bound is the TTFT count.
  Histograms also count requests that were still running at the window's end on the TTFT side; A and B
  are capped at N.

Pure: frames in, a dataclass out; the window passed in.
"""

from __future__ import annotations

import datetime as dt
import math
from dataclasses import asdict, dataclass

import polars as pl

from analyzers.serving_latency import bucket_counts, fraction_within
from fleetscope.core.frames import require_columns

PER_REQUEST_TPOT = ("request_tpot_seconds",)


@dataclass(frozen=True)
class Goodput:
    method: str  # exact or bounded
    deployment: str
    window_s: float
    completed: float
    throughput_rps: float
    goodput_rps: float  # exact; for bounded, the midpoint is not given: see low/high
    goodput_low_rps: float
    goodput_high_rps: float
    attainment: float  # share of completed requests meeting both (exact), else NaN
    note: str = ""

    def to_dict(self) -> dict[str, object]:
        return asdict(self)


def _seconds(start: dt.datetime, end: dt.datetime) -> float:
    s = (end - start).total_seconds()
    if s <= 0:
        raise ValueError("the window must end after it starts")
    return s


def exact(requests: pl.DataFrame, *, deployment: str, ttft_slo_s: float, tpot_slo_s: float, start: dt.datetime, end: dt.datetime) -> Goodput:
    """Goodput of ``deployment`` in ``[start, end)`` from its request log (see the module docstring)."""
    require_columns(requests, "serving_request", ("deployment", "arrival", "first_token", "finish", "output_tokens", "status"))
    window_s = _seconds(start, end)
    r = requests.filter((pl.col("deployment") == deployment) & (pl.col("status") == "ok") & pl.col("finish").is_not_null()
                        & (pl.col("finish") >= start) & (pl.col("finish") < end))
    ttft = (pl.col("first_token") - pl.col("arrival")).dt.total_microseconds() / 1e6
    tpot = pl.when(pl.col("output_tokens") > 1).then(
        (pl.col("finish") - pl.col("first_token")).dt.total_microseconds() / 1e6 / (pl.col("output_tokens") - 1))
    r = r.with_columns(ttft.alias("ttft_s"), tpot.alias("tpot_s"))
    meets = pl.col("ttft_s").is_not_null() & (pl.col("ttft_s") <= ttft_slo_s) & (pl.col("tpot_s").is_null() | (pl.col("tpot_s") <= tpot_slo_s))
    completed = r.height
    good = r.filter(meets).height
    g = good / window_s
    return Goodput("exact", deployment, window_s, float(completed), completed / window_s, g, g, g,
                   good / completed if completed else math.nan)


def _count_within(counts: pl.DataFrame, metric: str, threshold: float) -> tuple[float, float, float, bool] | None:
    """(lower, upper, total, threshold is a bound) of one metric's observations at or under ``threshold``."""
    h = counts.filter(pl.col("metric") == metric).group_by("le").agg(pl.col("observations").sum())
    if h.height == 0:
        return None
    pairs = [(math.inf if le == "+Inf" else float(le), c) for le, c in zip(h["le"], h["observations"])]
    return (*fraction_within(pairs, threshold), threshold in {le for le, _ in pairs})


def bounded(buckets: pl.DataFrame, *, deployment: str, ttft_slo_s: float, tpot_slo_s: float, start: dt.datetime, end: dt.datetime) -> Goodput:
    """Bounds on the goodput of ``deployment`` in ``[start, end]`` from its histograms (see the module
    docstring); NaN bounds when the deployment has no TTFT or end-to-end histogram in the window."""
    window_s = _seconds(start, end)
    counts = bucket_counts(buckets.filter(pl.col("deployment") == deployment), start=start, end=end)
    e2e = _count_within(counts, "e2e_latency_seconds", math.inf)
    ttft = _count_within(counts, "ttft_seconds", ttft_slo_s)
    if e2e is None or ttft is None:
        return Goodput("bounded", deployment, window_s, math.nan, math.nan, math.nan, math.nan, math.nan, math.nan,
                       "no ttft_seconds or e2e_latency_seconds histogram in the window")
    n = e2e[2]
    a_lo, a_hi = min(ttft[0], n), min(ttft[1], n)
    tpot = next((t for t in (_count_within(counts, m, tpot_slo_s) for m in PER_REQUEST_TPOT) if t is not None), None)
    if tpot is None:
        lo, hi, note = 0.0, a_hi, "no per-request TPOT histogram: TPOT unbounded, upper bound from TTFT alone"
    else:
        b_lo, b_hi = min(tpot[0], n), min(tpot[1], n)
        lo, hi, note = max(0.0, a_lo + b_lo - n), min(a_hi, b_hi), ""
    if not ttft[3] or (tpot is not None and not tpot[3]):
        note = (note + "; " if note else "") + "an SLO threshold falls inside a bucket: bounds widened to the bucket's edges"
    return Goodput("bounded", deployment, window_s, n, n / window_s, math.nan, lo / window_s, hi / window_s, math.nan, note)
