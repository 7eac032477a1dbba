"""Inference servers' own ``/metrics`` bodies (Prometheus text exposition 0.0.4) → the serving frames of
``fleetscope/core/serving_frames.py``: histogram buckets, counters and gauges under one canonical name per
quantity, tied to a deployment, a replica, its model and version, and where the scrape says so its pod and
host.

Servers read, each a format of its own (detected by the names it exposes, never by file name):

* ``vllm`` — vLLM's ``vllm:`` names, V0 and V1. Renamed across versions and mapped to one name each:
  V0 ``vllm:time_per_output_token_seconds`` (one observation per output token after the first) is V1's
  ``vllm:inter_token_latency_seconds``; V0 ``vllm:gpu_cache_usage_perc`` is V1's
  ``vllm:kv_cache_usage_perc`` (both a 0–1 fraction despite "perc"); V1's
  ``vllm:request_time_per_output_token_seconds`` (one per request) is ``request_tpot_seconds``; the older
  V1 ``vllm:gpu_prefix_cache_*`` are ``vllm:prefix_cache_*``. ``vllm:cache_config_info``'s
  ``num_gpu_blocks`` × ``block_size`` becomes the ``kv_cache_capacity_tokens`` gauge. The ``_created``
  series and the deprecated ``avg_*_throughput`` gauges are skipped.
* ``nim`` — NVIDIA NIM for LLMs: vLLM's names without a prefix (``time_to_first_token_seconds``,
  ``request_finish_total``, ``num_request_max``).
* ``sglang`` — SGLang's ``sglang:`` names (``num_queue_reqs`` is the waiting queue, ``token_usage`` the
  KV pool's used fraction; ``time_per_output_token_seconds`` counts one per token, so it is inter-token
  latency). Its ``le`` label comes before ``model_name``: label order carries no meaning.
* ``tgi`` — Hugging Face Text Generation Inference (``tgi_``; durations in seconds without a unit suffix,
  integer ``le`` written without ``.0``, some families without HELP).
* ``triton`` — NVIDIA Triton Inference Server (``nv_inference_*`` per model and version, GPU series per
  ``gpu_uuid``, the ``nv_energy_consumption`` joules counter) and its TensorRT-LLM backend
  (``nv_trt_llm_*``, gauges told apart by a label such as ``request_type``). Triton's ``*_duration_us``
  are cumulative **counters** of microseconds, not histograms: they become ``*_duration_seconds_total``
  counters (mean latency is a ratio of their increases to the request counter's). Its ``*_summary_us``
  quantiles are skipped: a summary's quantiles cannot be aggregated over replicas or time, and in the one
  real body published every one of them is 3.

Each server's table (``TABLES``) maps an exposed family to ``(kind, canonical name, scale)``, and where a
label selects the quantity (``nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type="used"}``) the label's
values to names. Lines of families not in the table (``process_*``, ``python_*``, HTTP middleware) are
skipped without being read (a malformed one among them is not an error) and counted in
``meta["skipped_series"]``.

Identity. ``model`` is the sample's ``model_name`` or ``model`` label, ``version`` its ``version``. The
deployment is the caller's, else the sample's ``deployment`` label, else its model, else the body's one
model when it names exactly one, else the source. The replica is the caller's, else the ``replica``,
``pod`` or ``instance`` label, else the source. ``namespace``/``pod`` and ``node``/``host``/``hostname``
(what Kubernetes service discovery and dcgm-exporter's pod attribution attach) go to ``serving_replica``
and are dropped from ``labels``, like ``job`` and ``container``; vLLM's ``finished_reason`` is written
``finish_reason``, TGI's ``err`` ``reason``.

Histograms keep their buckets as written (cumulative, per ``le``); a histogram with ``_count`` but no
``+Inf`` bucket gets one equal to ``_count``, which the format defines them to be. Sample timestamps
are kept when the body has them, else the scrape time the caller passes (``needs_ts``).

Bad input raises ``ParseError`` naming the source, the line and the field, and nothing is returned: not
UTF-8, NUL bytes, a line over 64 KiB, a body over 64 MiB, a malformed line (``fleetscope.core.promtext``,
the one lexer), an ``le`` that is not a number, a counter or bucket that is negative or not finite, more
than 64 labels or a label value over 4 KiB on one sample, more than 2,000,000 samples. A gauge written
``NaN`` (vLLM's speculative-decoding rates before any draft) is skipped and counted, not stored. The last
line may lack its line feed: NIM and Triton end their bodies so.

Pure: bytes in, a ``Batch`` out.
"""

from __future__ import annotations

import datetime as dt
import math
import re
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field

import polars as pl

from fleetscope.core import frames as F
from fleetscope.core import serving_frames as SF
from fleetscope.core.errors import ParseError
from fleetscope.core.promtext import escape, label_map, lex_line
from fleetscope.core.textinput import input_lines
from ingest.format import FormatSpec, Sniff, SniffView

MAX_INPUT_BYTES = 64 * 2**20
MAX_LINE_BYTES = 64 * 1024
MAX_SAMPLES = 2_000_000
MAX_LABELS = 64
MAX_LABEL_VALUE = 4096

# Labels that name the series' identity or its place, not a distinct quantity.
_IDENTITY = {"model_name", "model", "version", "deployment", "replica"}
_PLACE = {"namespace", "pod", "pod_name", "node", "host", "hostname", "instance", "job", "container", "service", "endpoint"}
_RENAME = {"finished_reason": "finish_reason", "err": "reason"}


@dataclass(frozen=True)
class Rule:
    """How one exposed family becomes a canonical series: ``kind`` histogram, counter or gauge; ``scale``
    multiplies values (and a histogram's bounds and sum) into the canonical unit; ``by`` names a label whose
    value picks the canonical name from ``names`` (values not listed are skipped)."""

    kind: str
    name: str = ""
    scale: float = 1.0
    by: str = ""
    names: dict[str, str] = field(default_factory=dict)


def H(name: str, scale: float = 1.0) -> Rule:
    return Rule("histogram", name, scale)


def C(name: str, scale: float = 1.0) -> Rule:
    return Rule("counter", name, scale)


def G(name: str, scale: float = 1.0) -> Rule:
    return Rule("gauge", name, scale)


# vLLM without its prefix: NIM exposes these bare.
_VLLM_NAMES: dict[str, Rule] = {
    "time_to_first_token_seconds": H("ttft_seconds"),
    "time_per_output_token_seconds": H("inter_token_latency_seconds"),  # V0; V1 renamed it
    "inter_token_latency_seconds": H("inter_token_latency_seconds"),
    "request_time_per_output_token_seconds": H("request_tpot_seconds"),
    "e2e_request_latency_seconds": H("e2e_latency_seconds"),
    "request_queue_time_seconds": H("queue_time_seconds"),
    "request_prefill_time_seconds": H("prefill_time_seconds"),
    "request_decode_time_seconds": H("decode_time_seconds"),
    "request_inference_time_seconds": H("inference_time_seconds"),
    "request_prompt_tokens": H("request_prompt_tokens"),
    "request_generation_tokens": H("request_generation_tokens"),
    "request_max_num_generation_tokens": H("request_max_generation_tokens"),
    "iteration_tokens_total": H("iteration_tokens"),
    "prompt_tokens_total": C("prompt_tokens_total"),
    "generation_tokens_total": C("generation_tokens_total"),
    "num_preemptions_total": C("preemptions_total"),
    "prefix_cache_queries_total": C("prefix_cache_queried_tokens_total"),
    "prefix_cache_hits_total": C("prefix_cache_hit_tokens_total"),
    "gpu_prefix_cache_queries_total": C("prefix_cache_queried_tokens_total"),
    "gpu_prefix_cache_hits_total": C("prefix_cache_hit_tokens_total"),
    "num_requests_running": G("requests_running"),
    "num_requests_waiting": G("requests_waiting"),
    "num_requests_swapped": G("requests_swapped"),
    "gpu_cache_usage_perc": G("kv_cache_usage_ratio"),  # V0
    "kv_cache_usage_perc": G("kv_cache_usage_ratio"),  # V1
}

TABLES: dict[str, tuple[str, dict[str, Rule]]] = {
    "vllm": ("vllm:", {**_VLLM_NAMES, "request_success_total": C("requests_finished_total")}),
    "nim": ("", {
        **_VLLM_NAMES,
        "request_finish_total": C("requests_finished_total"),
        "request_success_total": C("requests_succeeded_total"),
        "request_failure_total": C("requests_failed_total"),
        "num_request_max": G("requests_max"),
    }),
    "sglang": ("sglang:", {
        "time_to_first_token_seconds": H("ttft_seconds"),
        "time_per_output_token_seconds": H("inter_token_latency_seconds"),
        "inter_token_latency_seconds": H("inter_token_latency_seconds"),
        "e2e_request_latency_seconds": H("e2e_latency_seconds"),
        "queue_time_seconds": H("queue_time_seconds"),
        "prompt_tokens_total": C("prompt_tokens_total"),
        "generation_tokens_total": C("generation_tokens_total"),
        "num_requests_total": C("requests_finished_total"),
        "num_running_reqs": G("requests_running"),
        "num_queue_reqs": G("requests_waiting"),
        "token_usage": G("kv_cache_usage_ratio"),
        "num_used_tokens": G("kv_cache_used_tokens"),
        "gen_throughput": G("generation_throughput_tokens_per_s"),
        "cache_hit_rate": G("prefix_cache_hit_ratio"),
    }),
    "tgi": ("tgi_", {
        "request_duration": H("e2e_latency_seconds"),
        "request_queue_duration": H("queue_time_seconds"),
        "request_inference_duration": H("inference_time_seconds"),
        "request_validation_duration": H("validation_time_seconds"),
        "request_mean_time_per_token_duration": H("request_tpot_seconds"),
        "request_input_length": H("request_prompt_tokens"),
        "request_generated_tokens": H("request_generation_tokens"),
        "request_max_new_tokens": H("request_max_generation_tokens"),
        "batch_forward_duration": H("batch_forward_seconds"),
        "batch_inference_duration": H("batch_inference_seconds"),
        "batch_decode_duration": H("batch_decode_seconds"),
        "batch_filter_duration": H("batch_filter_seconds"),
        "batch_concat_duration": H("batch_concat_seconds"),
        "batch_next_size": H("batch_next_size"),
        "request_count": C("requests_total"),
        "request_success": C("requests_succeeded_total"),
        "request_failure": C("requests_failed_total"),
        "batch_inference_count": C("batch_inferences_total"),
        "batch_inference_success": C("batch_inferences_succeeded_total"),
        "batch_concat": C("batch_concats_total"),
        "queue_size": G("requests_waiting"),
        "batch_current_size": G("requests_running"),
        "batch_current_max_tokens": G("batch_max_tokens"),
    }),
    "triton": ("nv_", {
        "inference_request_success": C("requests_succeeded_total"),
        "inference_request_failure": C("requests_failed_total"),
        "inference_count": C("inferences_total"),
        "inference_exec_count": C("executions_total"),
        "inference_request_duration_us": C("request_duration_seconds_total", 1e-6),
        "inference_queue_duration_us": C("queue_duration_seconds_total", 1e-6),
        "inference_compute_input_duration_us": C("compute_input_duration_seconds_total", 1e-6),
        "inference_compute_infer_duration_us": C("compute_infer_duration_seconds_total", 1e-6),
        "inference_compute_output_duration_us": C("compute_output_duration_seconds_total", 1e-6),
        "inference_first_response_histogram_ms": H("ttft_seconds", 1e-3),
        "inference_pending_request_count": G("requests_waiting"),
        "energy_consumption": C("gpu_energy_joules_total"),
        "gpu_utilization": G("gpu_utilization_ratio"),
        "gpu_memory_total_bytes": G("gpu_memory_total_bytes"),
        "gpu_memory_used_bytes": G("gpu_memory_used_bytes"),
        "gpu_power_usage": G("gpu_power_watts"),
        "gpu_power_limit": G("gpu_power_limit_watts"),
        "trt_llm_request_metrics": Rule("gauge", by="request_type", names={
            "active": "requests_running", "waiting": "requests_waiting", "max": "requests_max",
            "scheduled": "requests_scheduled", "context": "requests_in_context"}),
        "trt_llm_kv_cache_block_metrics": Rule("gauge", by="kv_cache_block_type", names={
            "used": "kv_cache_used_blocks", "free": "kv_cache_free_blocks", "max": "kv_cache_max_blocks",
            "tokens_per": "kv_cache_block_size_tokens", "fraction": "kv_cache_usage_ratio"}),
    }),
}


_NAME = re.compile(r"[^{ \t]*")


def _name_end(line: str) -> int:
    return _NAME.match(line).end()  # type: ignore[union-attr]


def _unmapped(table: dict[str, Rule], bare: str) -> bool:
    if bare in table or bare == "cache_config_info":
        return False
    for suffix in ("_bucket", "_sum", "_count"):
        if bare.endswith(suffix) and bare[: -len(suffix)] in table:
            return False
    return True


def _le_text(v: float) -> str:
    return "+Inf" if v == math.inf else repr(v)


def _labels_text(labels: dict[str, str]) -> str:
    return ",".join(f'{k}="{escape(v)}"' for k, v in sorted(labels.items()))


class _Series:
    __slots__ = ("buckets", "sum", "count")

    def __init__(self) -> None:
        self.buckets: dict[float, float] = {}
        self.sum: float | None = None
        self.count: float | None = None


def parse(data: bytes, *, server: str, source: str = "serving", ts: dt.datetime | None = None,
          deployment: str | None = None, replica: str | None = None) -> F.Batch:
    """The serving frames of one ``server``'s ``/metrics`` body (``TABLES`` names the servers)."""
    if server not in TABLES:
        raise ParseError(f"unknown server {server!r}: expected one of {', '.join(TABLES)}", source=source)
    if ts is not None and ts.tzinfo is None:
        raise ParseError("ts must be timezone-aware", source=source)
    prefix, table = TABLES[server]
    lines = input_lines(data, source, max_input_bytes=MAX_INPUT_BYTES, max_line_bytes=MAX_LINE_BYTES)

    def items() -> Iterator[tuple[int, str, dict[str, str], float, int | None] | None]:
        for lineno, line in lines:
            if line.startswith("#"):
                continue
            # Families the table does not map are skipped before lexing: most of a body is buckets of the
            # mapped ones, but a process's own series (python_*, process_*, http_*) are not read at all.
            head = line[: _name_end(line)]
            if not head.startswith(prefix) or _unmapped(table, head[len(prefix):]):
                yield None
                continue
            lexed = lex_line(line, lineno, source)
            if lexed is None:
                continue
            _, name, pairs, value, ts_ms = lexed
            if len(pairs) > MAX_LABELS:
                raise ParseError(f"{name} has {len(pairs)} labels, more than {MAX_LABELS}", source=source, line=lineno, field="labels")
            yield lineno, name, label_map(pairs, name=name, source=source, line=lineno), value, ts_ms

    return _assemble(items(), lambda _name: server, source=source, ts=ts, deployment=deployment, replica=replica)


def server_of(name: str) -> str | None:
    """The server whose names ``name`` belongs to, by prefix (NIM's bare names are not told apart this way)."""
    for server, (prefix, _) in TABLES.items():
        if prefix and name.startswith(prefix):
            return server
    return None


def from_samples(samples: pl.DataFrame, labels: pl.DataFrame, *, source: str = "", meta: dict | None = None) -> F.Batch:
    """The serving frames of inference-server series that arrived by another transport than the text format
    (Prometheus remote write), in the long shape ``ingest.dcgm.from_samples`` takes: ``samples`` (``line``,
    ``name``, ``bid``, ``value``, ``ts_ms``) and ``labels`` (``bid``, ``name``, ``value``). Each series is mapped
    by the table of the server its prefix names, by the same code as a ``/metrics`` body."""
    sets: dict[int, dict[str, str]] = {}
    for bid, k, v in labels.select("bid", "name", "value").iter_rows():
        if k != "__name__":
            sets.setdefault(int(bid), {})[k] = v

    def items() -> Iterator[tuple[int, str, dict[str, str], float, int | None] | None]:
        for line, name, bid, value, ts_ms in samples.select("line", "name", "bid", "value", "ts_ms").iter_rows():
            yield int(line), name, dict(sets.get(int(bid), {})), float(value), int(ts_ms)

    out = _assemble(items(), server_of, source=source, ts=None, deployment=None, replica=None)
    out.meta = {**(meta or {}), **out.meta}
    return out


def from_items(items: Iterable[tuple[int, str, dict[str, str], float, int | None]], *, source: str = "") -> F.Batch:
    """The serving frames of samples already split into ``(line, name, labels, value, ts_ms)`` by another
    reader (OTLP), each mapped by the table of the server its name's prefix names."""
    return _assemble(items, server_of, source=source, ts=None, deployment=None, replica=None)


def _assemble(items: Iterable[tuple[int, str, dict[str, str], float, int | None] | None], server_for: Callable[[str], str | None], *,
              source: str, ts: dt.datetime | None, deployment: str | None, replica: str | None) -> F.Batch:
    hist: dict[tuple, _Series] = {}
    scalars: dict[str, dict[tuple, float]] = {"counter": {}, "gauge": {}}
    places: dict[tuple[str, str], dict[str, str]] = {}
    models: set[str] = set()
    pending: list[tuple[int, dict[str, str], str, str, float, dt.datetime, str, str | None, str]] = []
    skipped = nonfinite = samples = 0
    servers: set[str] = set()
    for item in items:
        samples += 1
        if item is None:
            skipped += 1
            continue
        lineno, name, labels, value, ts_ms = item
        if samples > MAX_SAMPLES:
            raise ParseError(f"more than {MAX_SAMPLES} samples", source=source, line=lineno)
        if len(labels) > MAX_LABELS:
            raise ParseError(f"{name} has {len(labels)} labels, more than {MAX_LABELS}", source=source, line=lineno, field="labels")
        for k, v in labels.items():
            if len(v) > MAX_LABEL_VALUE:
                raise ParseError(f"label {k} of {name} is longer than {MAX_LABEL_VALUE} characters", source=source, line=lineno, field=k)
        server = server_for(name)
        if server is None:
            skipped += 1
            continue
        prefix, table = TABLES[server]
        if not name.startswith(prefix) or "quantile" in labels:
            skipped += 1
            continue
        bare = name[len(prefix):]
        part, rule = "", table.get(bare)
        if rule is None:
            for suffix in ("_bucket", "_sum", "_count"):
                if bare.endswith(suffix):
                    r = table.get(bare[: -len(suffix)])
                    if r is not None and r.kind == "histogram":
                        part, rule = suffix, r
                    break
        if bare == "cache_config_info" and server == "vllm":
            blocks, size = labels.get("num_gpu_blocks", ""), labels.get("block_size", "")
            if not (blocks.isdigit() and size.isdigit()):
                skipped += 1
                continue
            rule, value = G("kv_cache_capacity_tokens"), float(int(blocks) * int(size))
            labels = {k: v for k, v in labels.items() if k in _IDENTITY | _PLACE}
        if rule is None or (rule.kind == "histogram" and not part):
            skipped += 1
            continue
        metric = rule.name
        if rule.by:
            metric = rule.names.get(labels.pop(rule.by, ""), "")
            if not metric:
                skipped += 1
                continue
        if ts_ms is not None:
            if abs(ts_ms) > 2**53:
                raise ParseError("timestamp out of range", source=source, line=lineno, field="timestamp")
            when = dt.datetime.fromtimestamp(ts_ms / 1000, tz=dt.UTC)
        elif ts is not None:
            when = ts.astimezone(dt.UTC)
        else:
            raise ParseError("sample has no timestamp and none was given (pass ts)", source=source, line=lineno)
        model = labels.get("model_name") or labels.get("model") or ""
        if model:
            models.add(model)
        kind = rule.kind
        if kind == "gauge" and not math.isfinite(value):
            nonfinite += 1
            continue
        if kind != "gauge" and part != "_sum" and (not math.isfinite(value) or value < 0):
            raise ParseError(f"{name} = {value!r}: a counter or bucket count must be finite and not negative",
                             source=source, line=lineno, field=name)
        if part == "_sum" and not math.isfinite(value):
            raise ParseError(f"{name} = {value!r} is not finite", source=source, line=lineno, field=name)
        le_text = None
        if part == "_bucket":
            raw = labels.pop("le", None)
            if raw is None:
                raise ParseError(f"{name} has no le label", source=source, line=lineno, field="le")
            try:
                le = float(raw)
            except ValueError:
                raise ParseError(f"le {raw[:40]!r} of {name} is not a number", source=source, line=lineno, field="le") from None
            if math.isnan(le):
                raise ParseError(f"le of {name} is NaN", source=source, line=lineno, field="le")
            le_text = repr(le * rule.scale) if le != math.inf else "+Inf"
        pending.append((lineno, labels, metric, kind + part, value * (rule.scale if part != "_bucket" and part != "_count" else 1.0),
                        when, model, le_text, server))
        servers.add(server)
    only_model = next(iter(models)) if len(models) == 1 else None
    for lineno, labels, metric, kindpart, value, when, model, le_text, server in pending:
        dep = deployment or labels.get("deployment") or model or only_model or source
        rep = replica or labels.get("replica") or labels.get("pod") or labels.get("instance") or source
        place = places.setdefault((dep, rep), {"server": server})
        for col, keys in (("namespace", ("namespace",)), ("pod", ("pod", "pod_name")), ("host", ("host", "hostname", "node"))):
            for k in keys:
                if labels.get(k):
                    place[col] = labels[k]
                    break
        if model:
            place.setdefault("model", model)
        if labels.get("version"):
            place.setdefault("version", labels["version"])
        rest = {_RENAME.get(k, k): v for k, v in labels.items() if k not in _IDENTITY and k not in _PLACE}
        key = (when, dep, rep, model, labels.get("version", ""), metric, _labels_text(rest))
        if kindpart.startswith("histogram"):
            s = hist.setdefault(key, _Series())
            if kindpart == "histogram_bucket":
                s.buckets[math.inf if le_text == "+Inf" else float(le_text)] = value  # type: ignore[arg-type]
            elif kindpart == "histogram_sum":
                s.sum = value
            else:
                s.count = value
        else:
            bucket = scalars[kindpart]
            if key in bucket and bucket[key] != value:
                raise ParseError(f"{metric} written twice with different values for one series", source=source, line=lineno, field=metric)
            bucket[key] = value
    cols = ("ts", "deployment", "replica", "model", "version", "metric", "labels")
    bucket_rows = []
    for key, s in hist.items():
        if math.inf not in s.buckets and s.count is not None:
            s.buckets[math.inf] = s.count
        for le in sorted(s.buckets):
            bucket_rows.append({**dict(zip(cols, key)), "le": _le_text(le), "cumulative_count": s.buckets[le], "sum": s.sum, "count": s.count})
    ts_of = [k[0] for k in (*hist, *scalars["counter"], *scalars["gauge"])]
    last = max(ts_of) if ts_of else None
    replica_rows = [{"deployment": d, "replica": r, **p, "last_seen": last, "source": source} for (d, r), p in places.items()]

    def frame(spec, rows):  # type: ignore[no-untyped-def]
        if not rows:
            return None
        return F.conform(spec, pl.DataFrame(rows, schema_overrides={c.name: c.dtype for c in spec.columns if c.name in rows[0]},
                                            infer_schema_length=None))

    return F.Batch(
        source=source,
        serving_replica=frame(SF.SERVING_REPLICA, replica_rows),
        serving_bucket=frame(SF.SERVING_BUCKET, bucket_rows),
        serving_counter=frame(SF.SERVING_COUNTER, [{**dict(zip(cols, k)), "value": v} for k, v in scalars["counter"].items()]),
        serving_gauge=frame(SF.SERVING_GAUGE, [{**dict(zip(cols, k)), "value": v} for k, v in scalars["gauge"].items()]),
        meta={"server": ",".join(sorted(servers)), "histograms": len(hist), "skipped_series": skipped, "nonfinite_gauges": nonfinite},
    )


def _has(pattern: str) -> Callable[[SniffView], bool]:
    rx = re.compile(pattern, re.MULTILINE)
    return lambda view: bool(rx.search(view.text))


# NIM: vLLM's names bare; told from a plain vLLM body by the missing prefix.
_NIM = _has(r"^(?:time_to_first_token_seconds_bucket|num_requests_running|gpu_cache_usage_perc|e2e_request_latency_seconds_bucket)\{[^\n]*model_name=")


def _spec(server: str, description: str, sniff: Sniff) -> FormatSpec:
    return FormatSpec(server, description, lambda d, s, o: parse(d, server=server, source=s, ts=o.ts), sniff=sniff, needs_ts=True)


FORMATS = (
    # After dcgm (30): a dcgm-exporter body has none of these names, and these bodies have no DCGM_ ones.
    _spec("vllm", "vLLM /metrics body, V0 or V1 (vllm: series; Prometheus text)", Sniff(31, _has(r"^vllm:[a-z_]+[{ ]"))),
    _spec("sglang", "SGLang /metrics body (sglang: series; Prometheus text)", Sniff(32, _has(r"^sglang:[a-z_]+[{ ]"))),
    _spec("tgi", "Hugging Face TGI /metrics body (tgi_ series; Prometheus text)", Sniff(33, _has(r"^tgi_(?:request|batch|queue)_[a-z_]*[{ ]"))),
    _spec("triton", "NVIDIA Triton /metrics body, TensorRT-LLM backend included (nv_inference_, nv_trt_llm_; Prometheus text)",
          Sniff(34, _has(r"^nv_(?:inference|trt_llm)_[a-z_]+[{ ]"))),
    _spec("nim", "NVIDIA NIM for LLMs /metrics body (vLLM's names without a prefix; Prometheus text)", Sniff(35, _NIM)),
)
