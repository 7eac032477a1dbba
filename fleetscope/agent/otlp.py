"""The agent's OTLP encoding: the readings of one tick as an OTLP ``ExportMetricsServiceRequest`` (the
OpenTelemetry SDK's ``MeterProvider`` and the OTLP exporter's protobuf encoder), every point stamped with
the tick's time; names are ``ingest.otlp_export.GPU_EXPORT``'s, the ones ``ingest.otlp`` reads back.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Iterable
from typing import Any

from fleetscope import __version__
from ingest.otlp_export import GPU_EXPORT

_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)


def _ns(ts: dt.datetime) -> int:
    return (ts - _EPOCH) // dt.timedelta(microseconds=1) * 1000


class OtlpEncoder:
    """The OpenTelemetry SDK pipeline of the agent: observable instruments whose callbacks hand out the
    readings of the current tick, a reader that collects on demand, and the OTLP exporter's encoder, which
    turns the collection into an ``ExportMetricsServiceRequest``.

    The SDK's OTLP/HTTP exporter would retry inside the tick (sleeping) and forget the request once it
    gave up, and its points carry the collection time; the agent sends the encoded request itself so that
    a failed one is kept with the time its readings were taken (``encode`` stamps every point with it).
    """

    def __init__(self, *, host: str) -> None:
        from opentelemetry.exporter.otlp.proto.common.metrics_encoder import encode_metrics  # lazy: OpenTelemetry SDK, only when used
        from opentelemetry.sdk.metrics import MeterProvider, ObservableCounter, ObservableGauge  # lazy: OpenTelemetry SDK, only when used
        from opentelemetry.sdk.metrics.export import MetricReader  # lazy: OpenTelemetry SDK, only when used
        from opentelemetry.sdk.resources import Resource  # lazy: OpenTelemetry SDK, only when used

        self._pending: dict[str, list[tuple[float, dict[str, str]]]] = {}
        encoded: list[Any] = []
        self._encoded = encoded

        class TickReader(MetricReader):
            """Collects only when asked (once per tick) and keeps the encoded request."""

            def __init__(self) -> None:
                # One point per GPU and metric: raise the SDK's default cap of 2,000 attribute sets per
                # instrument, past which points would be folded into an overflow series.
                super().__init__(cardinality_limits={ObservableGauge: 1_000_000, ObservableCounter: 1_000_000})

            def _receive_metrics(self, metrics_data: Any, timeout_millis: float = 10_000, **kwargs: Any) -> None:
                encoded.append(encode_metrics(metrics_data))

            def shutdown(self, timeout_millis: float = 30_000, **kwargs: Any) -> None:
                pass

        self.reader = TickReader()
        self.provider = MeterProvider(
            resource=Resource.create({"service.name": "fleetscope-agent", "service.version": __version__, "host.name": host}),
            metric_readers=[self.reader],
        )
        meter = self.provider.get_meter("fleetscope.agent", __version__)
        for name, unit, _ in GPU_EXPORT.values():
            # hw.energy is a counter in the hardware conventions; every other field is a gauge reading.
            make = meter.create_observable_counter if name == "hw.energy" else meter.create_observable_gauge
            make(name, callbacks=[self._callback(name)], unit=unit)

    def _callback(self, name: str) -> Callable[[Any], Iterable[Any]]:
        from opentelemetry.metrics import Observation  # lazy: OpenTelemetry SDK, only when used

        def observe(_options: Any) -> Iterable[Any]:
            return [Observation(v, a) for v, a in self._pending.get(name, ())]

        return observe

    def add(self, observations: dict[str, list[tuple[float, dict[str, str]]]]) -> int:
        """Queue one source's readings for this tick's request; returns the number of points."""
        for name, obs in observations.items():
            self._pending.setdefault(name, []).extend(obs)
        return sum(len(o) for o in observations.values())

    def encode(self, ts: dt.datetime) -> bytes | None:
        """Collect what was queued into a serialized ``ExportMetricsServiceRequest`` whose points say
        ``ts``; None when nothing was queued."""
        self._encoded.clear()
        try:
            self.reader.collect()
        finally:
            self._pending = {}
        if not self._encoded:
            return None
        req = self._encoded[-1]
        at = _ns(ts)
        n = 0
        for rm in req.resource_metrics:
            for sm in rm.scope_metrics:
                for m in sm.metrics:
                    kind = m.WhichOneof("data")
                    if kind not in ("gauge", "sum"):
                        continue
                    for p in getattr(m, kind).data_points:
                        p.time_unix_nano = at
                        if p.start_time_unix_nano > at:  # a counter's first collection starts after the reading
                            p.start_time_unix_nano = at
                        n += 1
        return req.SerializeToString() if n else None

    def close(self) -> None:
        self.provider.shutdown()
