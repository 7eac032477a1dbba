"""Inference-serving tables: what an LLM or model server's own ``/metrics`` says about a deployment's
replicas (latency histograms with their buckets, counters, gauges) and, where a deployment logs them, its
requests one by one.

Declared in the core floor so the ingest parsers (``ingest/serving_metrics.py``,
``ingest/serving_requests.py``) and the pure analyses (``analyzers/serving_latency.py``, ``slo.py``,
``serving_goodput.py``, ``serving_saturation.py``) share them; ``fleetscope.core.frames`` puts them in
``FRAMES`` (so a ``Batch`` carries them) and ``fleetscope/store/schema.py`` makes their tables.

Series identity. A server names its metrics its own way (vLLM V0 and V1 differ, SGLang, TGI, Triton and NIM
differ again); the parser maps each to one canonical ``metric`` name with its unit in the name
(``ttft_seconds``, ``generation_tokens_total``, ``kv_cache_usage_ratio``; the table is in
``ingest/serving_metrics.py``). A series is (``deployment``, ``replica``, ``model``, ``version``, ``metric``,
``labels``): ``labels`` holds the labels that still tell series apart once the ones the identity names are
taken out (``finish_reason="stop"``, TGI's ``method="decode"``), as ``name="value"`` pairs sorted and joined
by ``,`` (empty when none). Which GPUs serve a replica is ``serving_replica``'s pod and host, the same labels
dcgm-exporter's pod attribution puts on ``gpu_workload``.

Histogram buckets keep Prometheus' form: cumulative counts per upper bound ``le``, stored as the text
Prometheus uses for the label (``+Inf`` for the last; finite bounds as Python's shortest round-trip form
of the value, so ``1`` and ``1.0`` are one bucket), with the histogram's ``sum`` and ``count`` on every
bucket row of that scrape. Values are as scraped (cumulative since the server started); rates and resets are
the analyzers' business.
"""

from __future__ import annotations

import polars as pl

from fleetscope.core.spec import UTC_US, Col, FrameSpec, _f, _k, _r


def _series_key(*extra: Col) -> tuple[Col, ...]:
    return (
        _k("ts", UTC_US, doc="scrape time"),
        _k("deployment", pl.String, doc="the serving deployment (one model behind one endpoint)"),
        _k("replica", pl.String, doc="one server process of the deployment (a pod, an instance)"),
        _k("model", pl.String, default="", doc="the served model's name as the server reports it"),
        _k("version", pl.String, default="", doc="model version (Triton), else empty"),
        _k("metric", pl.String, doc="canonical name with its unit (ingest/serving_metrics.py: the name table)"),
        _k("labels", pl.String, default="", doc='the remaining labels, sorted: finish_reason="stop",method="decode"'),
        *extra,
    )


SERVING_REPLICA = FrameSpec(
    "serving_replica",
    (
        _k("deployment", pl.String),
        _k("replica", pl.String),
        _f("server", pl.String, doc="vllm, sglang, tgi, triton, nim"),
        _f("model", pl.String),
        _f("version", pl.String),
        _f("namespace", pl.String, doc="Kubernetes namespace of the replica's pod"),
        _f("pod", pl.String, doc="Kubernetes pod: joins gpu_workload (namespace, pod) for the replica's GPUs"),
        _f("host", pl.String, doc="the node the replica runs on"),
        _f("last_seen", UTC_US, doc="the newest scrape that named it"),
        _f("source", pl.String),
    ),
    on_conflict="update",
    doc="A replica of a serving deployment: its server, model and where it runs (pod, host).",
)

SERVING_BUCKET = FrameSpec(
    "serving_bucket",
    _series_key(_k("le", pl.String, doc="upper bound as Prometheus writes it: '+Inf' for the last bucket")) + (
        _r("cumulative_count", pl.Float64, doc="observations <= le since the server started"),
        _f("sum", doc="the histogram's _sum at this scrape (in the metric's unit)"),
        _f("count", doc="the histogram's _count at this scrape"),
    ),
    doc="One cumulative bucket of a serving latency or size histogram at one scrape.",
)

SERVING_COUNTER = FrameSpec(
    "serving_counter",
    _series_key() + (_r("value", pl.Float64, doc="cumulative since the server started (resets when it restarts)"),),
    doc="One serving counter at one scrape: tokens, requests by finish reason, preemptions, energy.",
)

SERVING_GAUGE = FrameSpec(
    "serving_gauge",
    _series_key() + (_r("value", pl.Float64),),
    doc="One serving gauge at one scrape: running and waiting requests, KV-cache use.",
)

SERVING_REQUEST = FrameSpec(
    "serving_request",
    (
        _k("deployment", pl.String),
        _k("replica", pl.String, default=""),
        _k("request_id", pl.String),
        _f("model", pl.String),
        _r("arrival", UTC_US, doc="when the server received the request"),
        _f("first_token", UTC_US, doc="when the first output token was sent (null: none was)"),
        _f("finish", UTC_US, doc="when the last token was sent or the request ended"),
        _f("prompt_tokens", pl.Int64),
        _f("output_tokens", pl.Int64),
        _r("status", pl.String, doc="ok, or why it ended otherwise (error, abort, timeout, ...)"),
        _f("source", pl.String),
    ),
    doc="One request of a serving deployment from its request log (ingest/serving_requests.py).",
)

SERVING_SLO = FrameSpec(
    "serving_slo",
    (
        _k("deployment", pl.String),
        _k("name", pl.String, doc="the SLO's name within the deployment"),
        _r("kind", pl.String, doc="latency or availability (analyzers/slo.py)"),
        _f("metric", pl.String, doc="a latency SLO's histogram: ttft_seconds, request_tpot_seconds, e2e_latency_seconds"),
        _f("threshold_s", doc="a latency SLO's limit, a bucket bound of the metric"),
        _r("objective", pl.Float64, doc="target fraction of good requests, e.g. 0.99"),
        _r("window_days", pl.Int64, doc="the error budget's window"),
        _f("updated_by", pl.String, doc="the token that set it"),
        _f("updated_at", UTC_US),
    ),
    on_conflict="update",
    doc="A service level objective of a serving deployment, evaluated by beat's serving window (burn-rate findings).",
)

SERVING_FRAMES: tuple[FrameSpec, ...] = (SERVING_REPLICA, SERVING_BUCKET, SERVING_COUNTER, SERVING_GAUGE, SERVING_REQUEST, SERVING_SLO)

PRICE_BOOK = FrameSpec(
    "price_book",
    (
        _k("site_id", pl.String),
        _k("gpu_model", pl.String, default="", doc="the GPU model the GPU-hour price is for; empty: any GPU at the site"),
        _k("valid_from", UTC_US, doc="the price holds from then until the next row of the same site and model"),
        _r("currency", pl.String, doc="ISO 4217 code, e.g. EUR"),
        _f("gpu_hour_price", doc="price of one GPU-hour (owned: amortisation and hosting; rented: the rate)"),
        _f("energy_price_per_kwh", doc="the site's electricity tariff per kWh"),
        _r("recorded_by", pl.String),
        _r("recorded_at", UTC_US),
    ),
    on_conflict="update",
    doc="A price of GPU time and electricity at a site, for the money per token of serving deployments.",
)
