"""Service level objectives for serving deployments: the SLI as good events over valid events, the error
budget, and multiwindow, multi-burn-rate alerts.

Definitions from the Google SRE Workbook (Beyer et al., O'Reilly 2018), ch. 2 "Implementing SLOs" and ch. 5
"Alerting on SLOs":

* SLI = good events / valid events. A latency objective "p99 TTFT ≤ 500 ms" is the request-based SLI
  "fraction of requests whose TTFT ≤ 500 ms" with objective 0.99; availability is the fraction of requests
  that ended well.
* Error budget = 1 − objective (of the events in the SLO window, 28 days by default). Budget left =
  1 − (bad events / (valid events · (1 − objective))).
* Burn rate over a window = error ratio in it / (1 − objective): 1 spends the budget exactly over the SLO
  window.
* Alerts (ch. 5, "6: Multiwindow, multi-burn-rate alerts", the recommended parameters for a 30-day
  objective): page when the 1 h and the 5 m burn rates both exceed 14.4 (2 % of the budget in an hour), page
  when the 6 h and 30 m both exceed 6 (5 % in six hours), ticket when the 3 d and 6 h both exceed 1 (10 % in
  three days). The short window makes the alert stop soon after the burn does.

Latency SLIs come from histogram buckets, where "≤ threshold" is known exactly only at a bucket bound: the
threshold must be a bound of the deployment's histogram (``sli_counts`` says so when it is not) — choose SLO
thresholds on bucket bounds, as Prometheus' own guidance for ``le``-based SLOs has it. Counts are
reset-aware increases (``analyzers.serving_latency.counter_increase``) summed over replicas.

Pure: frames in, frames and findings out; ``now`` passed in.
"""

from __future__ import annotations

import datetime as dt
import json
import math
from dataclasses import dataclass

import polars as pl

from analyzers.serving_latency import SERIES, increase_expr
from fleetscope.core.frames import findings_frame, require_columns

# (name, long window, short window, burn-rate threshold, severity): SRE Workbook ch. 5, table 5-8.
BURN_RULES: tuple[tuple[str, dt.timedelta, dt.timedelta, float, str], ...] = (
    ("page_fast", dt.timedelta(hours=1), dt.timedelta(minutes=5), 14.4, "critical"),
    ("page_slow", dt.timedelta(hours=6), dt.timedelta(minutes=30), 6.0, "critical"),
    ("ticket", dt.timedelta(days=3), dt.timedelta(hours=6), 1.0, "warning"),
)
GOOD_FINISH = ("stop", "length")  # vLLM finish reasons of a request served to its end


@dataclass(frozen=True)
class SLO:
    """One objective of a deployment. ``kind`` ``latency``: requests whose ``metric`` (a histogram:
    ``ttft_seconds``, ``request_tpot_seconds``, ``e2e_latency_seconds``) is ≤ ``threshold_s``; ``kind``
    ``availability``: requests that ended well. ``objective`` is the target fraction of good events."""

    name: str
    deployment: str
    kind: str
    objective: float
    metric: str = ""
    threshold_s: float = math.nan
    window: dt.timedelta = dt.timedelta(days=28)

    def __post_init__(self) -> None:
        if self.kind not in ("latency", "availability"):
            raise ValueError(f"SLO {self.name}: kind must be latency or availability, not {self.kind!r}")
        if not 0 < self.objective < 1:
            raise ValueError(f"SLO {self.name}: objective must be in (0, 1), not {self.objective}")
        if self.kind == "latency" and (not self.metric or not math.isfinite(self.threshold_s) or self.threshold_s <= 0):
            raise ValueError(f"SLO {self.name}: a latency SLO needs a histogram metric and a positive threshold_s")

    @property
    def budget(self) -> float:
        return 1.0 - self.objective


def _increase(df: pl.DataFrame, col: str, start: dt.datetime, end: dt.datetime, keys: list[str]) -> float:
    w = df.filter((pl.col("ts") >= start) & (pl.col("ts") <= end)).sort("ts")
    if w.height == 0:
        return 0.0
    return float(w.group_by(keys, maintain_order=True).agg(increase_expr(col).alias("inc"))["inc"].sum())


def sli_counts(slo: SLO, *, start: dt.datetime, end: dt.datetime, buckets: pl.DataFrame | None = None,
               counters: pl.DataFrame | None = None) -> tuple[float, float]:
    """``(good, valid)`` events of ``slo`` in ``[start, end]``, summed over the deployment's replicas.

    Latency: from ``serving_bucket`` rows of ``slo.metric`` — good is the bucket at ``le`` = threshold,
    valid the ``+Inf`` bucket. Raises ``ValueError`` when the threshold is not one of the histogram's bounds.
    Availability: from ``serving_counter`` — ``requests_succeeded_total`` against it plus
    ``requests_failed_total`` where the server counts those (TGI, Triton, NIM), else vLLM-style
    ``requests_finished_total`` by finish reason (stop and length good; abort, error and the rest bad)."""
    if slo.kind == "latency":
        if buckets is None:
            raise ValueError(f"SLO {slo.name}: a latency SLO needs serving_bucket rows")
        require_columns(buckets, "serving_bucket", ("ts", *SERIES, "le", "cumulative_count"))
        h = buckets.filter((pl.col("deployment") == slo.deployment) & (pl.col("metric") == slo.metric))
        bounds = {float(le) for le in h["le"].unique() if le != "+Inf"}
        if h.height and slo.threshold_s not in bounds:
            below = max((b for b in bounds if b < slo.threshold_s), default=None)
            above = min((b for b in bounds if b > slo.threshold_s), default=None)
            raise ValueError(f"SLO {slo.name}: {slo.threshold_s} s is not a bucket bound of {slo.metric} (it lies between "
                             f"{below} and {above}); the SLI would be a guess, so choose a bound")
        keys = list(SERIES)
        good = _increase(h.filter(pl.col("le") == repr(float(slo.threshold_s))), "cumulative_count", start, end, keys)
        valid = _increase(h.filter(pl.col("le") == "+Inf"), "cumulative_count", start, end, keys)
        return good, valid
    if counters is None:
        raise ValueError(f"SLO {slo.name}: an availability SLO needs serving_counter rows")
    require_columns(counters, "serving_counter", ("ts", *SERIES, "value"))
    c = counters.filter(pl.col("deployment") == slo.deployment)
    keys = list(SERIES)
    ok = c.filter(pl.col("metric") == "requests_succeeded_total")
    if ok.height:
        good = _increase(ok, "value", start, end, keys)
        bad = _increase(c.filter(pl.col("metric") == "requests_failed_total"), "value", start, end, keys)
        return good, good + bad
    fin = c.filter(pl.col("metric") == "requests_finished_total")
    is_good = pl.any_horizontal(*[pl.col("labels").str.contains(f'finish_reason="{r}"', literal=True) for r in GOOD_FINISH])
    good = _increase(fin.filter(is_good), "value", start, end, keys)
    return good, _increase(fin, "value", start, end, keys)


@dataclass(frozen=True)
class SLOStatus:
    slo: SLO
    good: float
    valid: float
    sli: float  # NaN with no events
    budget_left: float  # fraction of the window's error budget not yet spent (negative: overspent)
    burn_rates: dict[str, float]  # by window label: "5m", "1h", ...
    alerts: tuple[str, ...]  # names of BURN_RULES firing

    def to_dict(self) -> dict[str, object]:
        return {"slo": self.slo.name, "deployment": self.slo.deployment, "kind": self.slo.kind, "objective": self.slo.objective,
                "metric": self.slo.metric, "threshold_s": self.slo.threshold_s if self.slo.kind == "latency" else None,
                "good": self.good, "valid": self.valid, "sli": self.sli, "budget_left": self.budget_left,
                "burn_rates": self.burn_rates, "alerts": list(self.alerts)}


def _label(w: dt.timedelta) -> str:
    s = int(w.total_seconds())
    return f"{s // 86400}d" if s % 86400 == 0 else f"{s // 3600}h" if s % 3600 == 0 else f"{s // 60}m"


def burn_rate(slo: SLO, good: float, valid: float) -> float:
    """Error ratio over the SLO's budget; NaN with no valid events (nothing burnt, nothing known)."""
    if valid <= 0:
        return math.nan
    return ((valid - good) / valid) / slo.budget


def status(slo: SLO, *, now: dt.datetime, buckets: pl.DataFrame | None = None, counters: pl.DataFrame | None = None) -> SLOStatus:
    """The SLI and budget of ``slo`` over its window ending ``now``, each burn-rate window's rate, and
    which multiwindow rules fire (both their windows over the threshold)."""
    good, valid = sli_counts(slo, start=now - slo.window, end=now, buckets=buckets, counters=counters)
    sli = good / valid if valid > 0 else math.nan
    budget_left = 1.0 - ((valid - good) / (valid * slo.budget)) if valid > 0 else 1.0
    rates: dict[str, float] = {}
    fired = []
    for name, long_w, short_w, threshold, _ in BURN_RULES:
        for w in (long_w, short_w):
            if _label(w) not in rates:
                rates[_label(w)] = burn_rate(slo, *sli_counts(slo, start=now - w, end=now, buckets=buckets, counters=counters))
        lr, sr = rates[_label(long_w)], rates[_label(short_w)]
        if lr > threshold and sr > threshold:
            fired.append(name)
    return SLOStatus(slo, good, valid, sli, budget_left, rates, tuple(fired))


def _finite(v: object) -> object:
    """JSON has no NaN: a rate over a window without events is null."""
    if isinstance(v, float) and not math.isfinite(v):
        return None
    if isinstance(v, dict):
        return {k: _finite(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_finite(x) for x in v]
    return v


def burn_findings(statuses: list[SLOStatus], *, now: dt.datetime) -> pl.DataFrame:
    """One finding per firing rule of each SLO (kind ``slo_burn``), keyed by the rule's long window so a
    re-run in the same hour updates it; the evidence holds every window's burn rate and the budget left."""
    rows = []
    for st in statuses:
        for name, long_w, short_w, threshold, severity in BURN_RULES:
            if name not in st.alerts:
                continue
            lr, sr = st.burn_rates[_label(long_w)], st.burn_rates[_label(short_w)]
            start = now.replace(minute=0, second=0, microsecond=0) if long_w <= dt.timedelta(hours=6) else now.replace(hour=0, minute=0, second=0, microsecond=0)
            rows.append({
                "analyzer": "slo", "kind": "slo_burn", "subject": f"deployment:{st.slo.deployment}/slo:{st.slo.name}/{name}",
                "window_start": start, "window_end": now, "severity": severity, "score": float(lr),
                "summary": (f"SLO {st.slo.name} of {st.slo.deployment} burns its error budget at {lr:.1f}x over {_label(long_w)} "
                            f"and {sr:.1f}x over {_label(short_w)} (threshold {threshold}x); {st.budget_left:.0%} of the "
                            f"{_label(st.slo.window)} budget left."),
                "evidence": json.dumps(_finite({**st.to_dict(), "rule": name, "threshold": threshold})),
            })
    return findings_frame(rows)
