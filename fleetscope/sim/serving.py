"""A simulated serving deployment: vLLM V1 replicas' ``/metrics`` bodies scrape by scrape, with injected
faults whose place and time are reported exactly, so a test (and later the demo) can check each is found.

Load: every replica serves ``rps`` requests a second (Poisson counts per scrape interval); each request's TTFT
and per-request TPOT are lognormal around ``ttft_s`` and ``tpot_s``, its output ``output_tokens`` tokens, so
the inter-token gaps it adds are ``output_tokens − 1`` observations of its TPOT. Histograms use vLLM's own
bucket bounds (``vllm/v1/metrics/loggers.py``), counters and gauges its V1 names.

Faults (``ServingFaults``):

* **KV-cache saturation** of one replica: from ``kv_from_s`` its cache is 97 % used and requests queue
  (``num_requests_waiting`` 20–40), and the scheduler preempts running requests at a rising rate;
* **a throttled replica**: from ``throttle_from_s`` one replica's GPU runs slower, its TPOT ×
  ``throttle_factor`` (what a thermally throttled GPU does to decode);
* **an SLO burning its budget**: from ``burn_from_s`` for ``burn_s`` a share ``burn_share`` of every
  replica's requests wait 2 s for their first token (a prefill backlog), burning a TTFT ≤ 0.5 s objective.

Pure apart from the seeded generator: no clock, no files.
"""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Iterator
from dataclasses import dataclass, field

import numpy as np

TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0,
                160.0, 640.0, 2560.0)
TPOT_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0)
E2E_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0,
               1920.0, 7680.0)


@dataclass(frozen=True)
class ServingFaults:
    kv_replica: int | None = 1
    kv_from_s: float = 1200.0
    throttle_replica: int | None = 2
    throttle_from_s: float = 600.0
    throttle_factor: float = 2.5
    burn_from_s: float = 1800.0
    burn_s: float = 1500.0
    burn_share: float = 0.5


@dataclass(frozen=True)
class ServingSpec:
    deployment: str = "chat"
    model: str = "meta-llama/Llama-3.1-8B-Instruct"
    namespace: str = "serving"
    replicas: int = 4
    start: dt.datetime = dt.datetime(2026, 3, 1, 12, 0, tzinfo=dt.UTC)
    duration_s: float = 3600.0
    interval_s: float = 60.0
    rps: float = 4.0
    ttft_s: float = 0.08
    tpot_s: float = 0.03
    output_tokens: int = 200
    prompt_tokens: int = 1000
    seed: int = 7
    faults: ServingFaults = field(default_factory=ServingFaults)

    def pod(self, i: int) -> str:
        return f"{self.deployment}-{i}"


class _Hist:
    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = np.array(bounds)
        self.counts = np.zeros(len(bounds) + 1)
        self.sum = 0.0

    def observe(self, x: np.ndarray, weight: np.ndarray | None = None) -> None:
        w = np.ones_like(x) if weight is None else weight
        idx = np.searchsorted(self.bounds, x, side="left")  # le is inclusive: x == bound falls in that bucket
        np.add.at(self.counts, idx, w)
        self.sum += float((x * w).sum())

    def lines(self, name: str, labels: str) -> list[str]:
        cum = np.cumsum(self.counts)
        out = [f'{name}_bucket{{{labels},le="{b!r}"}} {c:.1f}' for b, c in zip(self.bounds.tolist(), cum[:-1].tolist())]
        out += [f'{name}_bucket{{{labels},le="+Inf"}} {cum[-1]:.1f}', f"{name}_count{{{labels}}} {cum[-1]:.1f}", f"{name}_sum{{{labels}}} {self.sum!r}"]
        return out


class _Replica:
    def __init__(self) -> None:
        self.ttft, self.tpot, self.itl, self.e2e = _Hist(TTFT_BUCKETS), _Hist(TPOT_BUCKETS), _Hist(TPOT_BUCKETS), _Hist(E2E_BUCKETS)
        self.prompt = self.generation = self.finished = self.preemptions = 0.0


def bodies(spec: ServingSpec) -> Iterator[tuple[dt.datetime, str, bytes]]:
    """``(scrape time, pod, body)`` for every replica at every scrape, in time order."""
    rng = np.random.default_rng([spec.seed, 19])
    reps = [_Replica() for _ in range(spec.replicas)]
    f = spec.faults
    n_scrapes = int(math.floor(spec.duration_s / spec.interval_s)) + 1
    for k in range(n_scrapes):
        t = k * spec.interval_s
        ts = spec.start + dt.timedelta(seconds=t)
        for i, r in enumerate(reps):
            if k:
                n = int(rng.poisson(spec.rps * spec.interval_s))
                ttft = rng.lognormal(math.log(spec.ttft_s), 0.25, n)
                if f.burn_from_s <= t < f.burn_from_s + f.burn_s:
                    ttft[rng.random(n) < f.burn_share] = 2.0
                tpot = rng.lognormal(math.log(spec.tpot_s), 0.15, n)
                if f.throttle_replica == i and t >= f.throttle_from_s:
                    tpot *= f.throttle_factor
                r.ttft.observe(ttft)
                r.tpot.observe(tpot)
                r.itl.observe(tpot, np.full(n, spec.output_tokens - 1.0))
                r.e2e.observe(ttft + tpot * (spec.output_tokens - 1))
                r.prompt += n * spec.prompt_tokens
                r.generation += n * spec.output_tokens
                r.finished += n
                if f.kv_replica == i and t >= f.kv_from_s:
                    r.preemptions += 2 + (t - f.kv_from_s) / spec.interval_s  # a rate that climbs
            saturated = f.kv_replica == i and t >= f.kv_from_s
            kv = 0.97 if saturated else float(np.clip(rng.normal(0.45, 0.05), 0, 1))
            waiting = float(rng.integers(20, 41)) if saturated else 0.0
            labels = f'engine="0",model_name="{spec.model}",namespace="{spec.namespace}",pod="{spec.pod(i)}"'
            lines = [
                "# TYPE vllm:num_requests_running gauge", f"vllm:num_requests_running{{{labels}}} {float(rng.integers(8, 16))}",
                "# TYPE vllm:num_requests_waiting gauge", f"vllm:num_requests_waiting{{{labels}}} {waiting}",
                "# TYPE vllm:kv_cache_usage_perc gauge", f"vllm:kv_cache_usage_perc{{{labels}}} {kv!r}",
                "# TYPE vllm:num_preemptions_total counter", f"vllm:num_preemptions_total{{{labels}}} {r.preemptions:.1f}",
                "# TYPE vllm:prompt_tokens_total counter", f"vllm:prompt_tokens_total{{{labels}}} {r.prompt:.1f}",
                "# TYPE vllm:generation_tokens_total counter", f"vllm:generation_tokens_total{{{labels}}} {r.generation:.1f}",
                "# TYPE vllm:request_success_total counter",
                f'vllm:request_success_total{{{labels},finished_reason="stop"}} {r.finished:.1f}',
                "# TYPE vllm:time_to_first_token_seconds histogram", *r.ttft.lines("vllm:time_to_first_token_seconds", labels),
                "# TYPE vllm:request_time_per_output_token_seconds histogram",
                *r.tpot.lines("vllm:request_time_per_output_token_seconds", labels),
                "# TYPE vllm:inter_token_latency_seconds histogram", *r.itl.lines("vllm:inter_token_latency_seconds", labels),
                "# TYPE vllm:e2e_request_latency_seconds histogram", *r.e2e.lines("vllm:e2e_request_latency_seconds", labels),
            ]
            yield ts, spec.pod(i), ("\n".join(lines) + "\n").encode()


def injected(spec: ServingSpec) -> list[dict[str, object]]:
    """The faults as a manifest: what, which replica, from when (until when)."""
    f, at = spec.faults, lambda s: spec.start + dt.timedelta(seconds=s)  # noqa: E731
    out: list[dict[str, object]] = []
    if f.kv_replica is not None:
        out.append({"fault": "kv_cache_saturated", "replica": spec.pod(f.kv_replica), "start": at(f.kv_from_s)})
    if f.throttle_replica is not None:
        out.append({"fault": "throttled_replica", "replica": spec.pod(f.throttle_replica), "start": at(f.throttle_from_s),
                    "tpot_factor": f.throttle_factor})
    if f.burn_s > 0:
        out.append({"fault": "slo_burn", "replica": None, "start": at(f.burn_from_s), "end": at(f.burn_from_s + f.burn_s),
                    "share_at_2s": f.burn_share})
    return out


def for_window(start: dt.datetime, duration_s: float, *, interval_s: float = 60.0, seed: int = 7) -> ServingSpec:
    """A deployment over ``[start, start + duration_s]`` whose faults scale with it and are still on at its
    end (the demo's window ends now, and beat's windows look back from now): the throttle from a sixth in,
    the KV cache full from a third, the SLO burning from half way."""
    d = float(duration_s)
    faults = ServingFaults(throttle_from_s=d / 6, kv_from_s=d / 3, burn_from_s=d / 2, burn_s=d)
    return ServingSpec(start=start, duration_s=d, interval_s=interval_s, seed=seed, faults=faults)


def scrape_bodies(spec: ServingSpec) -> Iterator[tuple[dt.datetime, bytes]]:
    """Every replica's body of one scrape in one, as a collector relaying them sends it."""
    ts_prev, parts = None, []
    for ts, _pod, body in bodies(spec):
        if ts_prev is not None and ts != ts_prev:
            yield ts_prev, b"".join(parts)
            parts = []
        ts_prev = ts
        parts.append(body)
    if ts_prev is not None:
        yield ts_prev, b"".join(parts)
