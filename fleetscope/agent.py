"""`fleetscope agent`: the node-side collector. Polls dcgm-exporter endpoints and/or NVML on an interval
and pushes what it reads to the Fleetscope API, so GPU hosts need no database access.

Two ways to push (``push``):

- ``otlp`` (default): the readings go out as OpenTelemetry metrics, through the OpenTelemetry SDK's
  ``MeterProvider`` and its OTLP/HTTP exporter (protobuf, gzip) to the server's ``POST /v1/metrics``, with
  the token as a bearer header. Names are the ones ``ingest.otlp`` reads back (``ingest.otlp.GPU_EXPORT``:
  the semconv ``hw.*`` metrics where they exist, DCGM field names otherwise), so the same agent can also
  feed any OTLP receiver, e.g. an OpenTelemetry Collector. The resource says ``service.name``
  ``fleetscope-agent`` and ``host.name``; each point carries the GPU as ``hw.id``. Each tick collects once
  and exports all sources in one request; the SDK stamps points with the collection time.
- ``batch``: the exporter's body is forwarded to ``POST /api/v1/ingest/dcgm`` and NVML readings go to
  ``POST /api/v1/batches``: everything the parsers read, including DCGM fields without a gpu_sample column
  (kept as metric_sample series), which OTLP mode does not send.

A failed scrape or push is logged and counted, and the next tick goes on: one exporter down must not stop
the others. A refused token (401/403) stops the agent, since every later push would be refused too.
"""

from __future__ import annotations

import datetime as dt
import logging
import socket
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import httpx

log = logging.getLogger("fleetscope.agent")

PUSH_MODES = ("otlp", "batch")


class AgentStopped(RuntimeError):
    pass


@dataclass
class TickReport:
    ts: dt.datetime
    pushed: dict[str, dict[str, int]] = field(default_factory=dict)
    errors: dict[str, str] = field(default_factory=dict)
    points: int = 0  # OTLP data points exported this tick
    rejected_points: int = 0  # of which the receiver refused (OTLP partial success)


class OtlpPusher:
    """The OpenTelemetry SDK pipeline of the agent: observable instruments whose callbacks hand out the
    readings of the current tick, a reader that collects on demand, and the OTLP/HTTP exporter.

    The SDK exporter reports success or failure only; a ``requests`` response hook keeps the last HTTP
    status and body so that a refused token stops the agent and a partial success is counted.
    """

    def __init__(self, endpoint: str, token: str, *, host: str, timeout_s: float) -> None:
        import requests
        from opentelemetry.exporter.otlp.proto.http import Compression
        from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
        from opentelemetry.sdk.metrics import MeterProvider, ObservableCounter, ObservableGauge
        from opentelemetry.sdk.metrics.export import MetricExportResult, MetricReader
        from opentelemetry.sdk.resources import Resource

        from fleetscope import __version__
        from ingest.otlp import GPU_EXPORT

        self._pending: dict[str, list[tuple[float, dict[str, str]]]] = {}
        self.last_status: int | None = None
        self.last_body = b""
        session = requests.Session()
        session.hooks["response"].append(self._on_response)
        exporter = OTLPMetricExporter(endpoint=endpoint, headers={"Authorization": f"Bearer {token}"},
                                      compression=Compression.Gzip, timeout=timeout_s, session=session)
        success = MetricExportResult.SUCCESS

        class TickReader(MetricReader):
            """Collects only when asked (once per tick) and remembers whether the export went through."""

            def __init__(self) -> None:
                # One point per GPU and metric: raise the SDK's default cap of 2,000 attribute sets per
                # instrument, past which points would be folded into an overflow series.
                super().__init__(cardinality_limits={ObservableGauge: 1_000_000, ObservableCounter: 1_000_000})
                self.ok = True

            def _receive_metrics(self, metrics_data: Any, timeout_millis: float = 10_000, **kwargs: Any) -> None:
                self.ok = exporter.export(metrics_data, timeout_millis=timeout_millis) == success

            def shutdown(self, timeout_millis: float = 30_000, **kwargs: Any) -> None:
                exporter.shutdown(timeout_millis=timeout_millis)

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
        from opentelemetry.metrics import Observation

        def observe(_options: Any) -> Iterable[Any]:
            return [Observation(v, a) for v, a in self._pending.get(name, ())]

        return observe

    def _on_response(self, resp: Any, *args: Any, **kwargs: Any) -> None:
        self.last_status, self.last_body = resp.status_code, resp.content

    def add(self, observations: dict[str, list[tuple[float, dict[str, str]]]]) -> int:
        """Queue one source's readings for this tick's export; returns the number of points."""
        for name, obs in observations.items():
            self._pending.setdefault(name, []).extend(obs)
        return sum(len(o) for o in observations.values())

    def export(self) -> int:
        """Collect and export what was queued; returns the points the receiver rejected. Raises
        AgentStopped on a refused token and RuntimeError when the export failed."""
        from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceResponse

        self.last_status, self.last_body = None, b""
        try:
            self.reader.collect()
        finally:
            self._pending = {}
        if self.last_status in (401, 403):
            raise AgentStopped(f"the API refused the token ({self.last_status}) on OTLP export: {self.last_body[:200]!r}")
        if not self.reader.ok:
            raise RuntimeError(f"OTLP export failed (HTTP {self.last_status or 'no response'}): {self.last_body[:300]!r}")
        try:
            return int(ExportMetricsServiceResponse.FromString(self.last_body).partial_success.rejected_data_points)
        except Exception:  # noqa: BLE001 - an empty or foreign 2xx body means nothing was rejected
            return 0

    def close(self) -> None:
        self.provider.shutdown()


@dataclass
class Agent:
    api_url: str
    token: str
    dcgm_urls: list[str] = field(default_factory=list)
    nvml: bool = False
    host: str = field(default_factory=socket.gethostname)
    timeout_s: float = 10.0
    push: str = "otlp"

    def __post_init__(self) -> None:
        if self.push not in PUSH_MODES:
            raise ValueError(f"push must be one of {', '.join(PUSH_MODES)}, not {self.push!r}")
        self.client = httpx.Client(timeout=self.timeout_s, headers={"Authorization": f"Bearer {self.token}"})
        self.otlp = OtlpPusher(f"{self.api_url}/v1/metrics", self.token, host=self.host, timeout_s=self.timeout_s) if self.push == "otlp" else None

    def _push(self, resp: httpx.Response, what: str) -> dict[str, int]:
        if resp.status_code in (401, 403):
            raise AgentStopped(f"the API refused the token ({resp.status_code}) while pushing {what}: {resp.text[:200]}")
        if resp.status_code != 200:
            raise RuntimeError(f"API answered {resp.status_code}: {resp.text[:300]}")
        return resp.json().get("written", {})

    def _queue(self, batch: Any) -> dict[str, int]:
        from ingest.otlp import gpu_observations

        points = self.otlp.add(gpu_observations(batch))
        return {"gpu_sample": batch.gpu_sample.height if batch.gpu_sample is not None else 0, "points": points}

    def _source(self, report: TickReport, name: str, read: Callable[[], dict[str, int]]) -> None:
        try:
            report.pushed[name] = read()
        except AgentStopped:
            raise
        except Exception as exc:  # noqa: BLE001 - reported, and the other sources go on
            report.errors[name] = str(exc).splitlines()[0][:300]
            log.warning("%s: %s", name, report.errors[name])

    def tick(self, now: dt.datetime | None = None) -> TickReport:
        now = now or dt.datetime.now(dt.UTC)
        report = TickReport(ts=now)
        for url in self.dcgm_urls:
            self._source(report, url, lambda url=url: self._dcgm(url, now))
        if self.nvml:
            self._source(report, "nvml", lambda: self._nvml(now))
        if self.otlp is not None and report.pushed:
            report.points = sum(p.get("points", 0) for p in report.pushed.values())
            try:
                report.rejected_points = self.otlp.export()
            except AgentStopped:
                raise
            except Exception as exc:  # noqa: BLE001 - the readings of this tick are lost; the next tick tries again
                msg = str(exc).splitlines()[0][:300]
                for name in report.pushed:
                    report.errors[name] = msg
                report.pushed = {}
                log.warning("otlp export: %s", msg)
        return report

    def _dcgm(self, url: str, now: dt.datetime) -> dict[str, int]:
        body = self.client.get(url).raise_for_status().content
        if self.push == "batch":
            resp = self.client.post(f"{self.api_url}/api/v1/ingest/dcgm", content=body,
                                    params={"ts": now.isoformat(), "source": url}, headers={"Content-Type": "text/plain"})
            return self._push(resp, url)
        from ingest import dcgm

        return self._queue(dcgm.parse(body, source=url, ts=now))

    def _nvml(self, now: dt.datetime) -> dict[str, int]:
        from ingest import nvml

        batch = nvml.to_batch(nvml.read_devices(), ts=now, host=self.host, xids=nvml.xid_events(0), source=f"nvml:{self.host}")
        if self.push == "batch":
            from fleetscope.demo import batch_to_json

            return self._push(self.client.post(f"{self.api_url}/api/v1/batches", json=batch_to_json(batch)), "nvml")
        return self._queue(batch)

    def close(self) -> None:
        self.client.close()
        if self.otlp is not None:
            self.otlp.close()

    def run(self, interval_s: float, *, ticks: int | None = None, on_tick: Any = None) -> None:
        """Tick every ``interval_s`` on a fixed schedule (a slow tick does not shift the next ones)."""
        n = 0
        next_at = time.monotonic()
        while ticks is None or n < ticks:
            report = self.tick()
            if on_tick:
                on_tick(report)
            n += 1
            next_at += interval_s
            time.sleep(max(0.0, next_at - time.monotonic()))
