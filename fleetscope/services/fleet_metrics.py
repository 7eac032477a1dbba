"""Fleetscope's derived fleet series in the Prometheus exposition format, for a site's own Prometheus,
Grafana and Alertmanager to scrape (``GET /api/v1/fleet/metrics``, ``fleetscope fleet metrics``).

What the analyzers conclude — goodput, badput, MFU and the goodput product per job, the C³ shares, stragglers and hangs, GPU health
findings, absence, energy and PUE per site — as gauges. GPU and host series carry dcgm-exporter's label
names (``UUID``, ``Hostname``), so a PromQL join such as
``DCGM_FI_DEV_GPU_TEMP * on(UUID) group_left fleetscope_gpu_health_score`` works against the scrape a
site already has. Values are what the store holds at scrape time; nothing is computed per scrape beyond a
few bounded reads (latest analyses, current findings, the last closed minute of energy).
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Iterator

import polars as pl
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from fleetscope.core import frames as F
from fleetscope.services.energy_rollup import PUE_SERIES, floor_minute
from fleetscope.store import Store

CURRENT = dt.timedelta(minutes=15)
"""A finding whose window ended within this long is current (the health sweep renews its findings every
five minutes; the job analyses every minute)."""
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


def _gpu_labels(subject: str, gpu_host: dict[str, str]) -> tuple[str, str] | None:
    if not subject.startswith("gpu:"):
        return None
    uuid = subject[4:]
    return uuid, gpu_host.get(uuid, "")


class _FleetCollector(Collector):
    def __init__(self, store: Store, now: dt.datetime) -> None:
        self.store, self.now = store, now

    def collect(self) -> Iterator[Metric]:
        yield from self._jobs()
        yield from self._findings()
        yield from self._sites()

    def _jobs(self) -> Iterator[Metric]:
        ja = self.store.read("job_analysis").filter(pl.col("analyzer").is_in(["goodput", "c3"]))
        good = GaugeMetricFamily("fleetscope_job_goodput_ratio", "Runtime goodput of the job (productive time / elapsed), as of its latest analysis.", labels=["job_id"])
        bad = GaugeMetricFamily("fleetscope_job_badput_seconds", "Badput of the job by bucket (ML Productivity Goodput), as of its latest analysis.", labels=["job_id", "bucket"])
        mfu = GaugeMetricFamily("fleetscope_job_mfu_ratio", "Program goodput of the job: model FLOPs utilisation against its GPU model's dense peak, as of its latest analysis.", labels=["job_id"])
        product = GaugeMetricFamily("fleetscope_job_goodput_product_ratio", "ML Productivity Goodput of the job: scheduling x runtime x program goodput, as of its latest analysis.", labels=["job_id"])
        c3 = GaugeMetricFamily("fleetscope_job_c3_ratio", "Share of the job's step time in compute (C1), exposed communication (C2) and coordination (C3).", labels=["job_id", "part"])
        for job_id, analyzer, text in ja.select("job_id", "analyzer", "result").iter_rows():
            r = json.loads(text)
            if analyzer == "goodput":
                if r.get("goodput_ratio") is not None:
                    good.add_metric([job_id], float(r["goodput_ratio"]))
                for bucket, s in sorted((r.get("badput_s") or {}).items()):
                    if s is not None:
                        bad.add_metric([job_id, bucket], float(s))
                if r.get("mfu_ratio") is not None:
                    mfu.add_metric([job_id], float(r["mfu_ratio"]))
                if r.get("goodput_product_ratio") is not None:
                    product.add_metric([job_id], float(r["goodput_product_ratio"]))
            else:
                for part, key in (("compute", "c1_ratio"), ("communication", "c2_ratio"), ("coordination", "c3_ratio")):
                    if r and r.get(key) is not None:
                        c3.add_metric([job_id, part], float(r[key]))
        yield from (good, bad, mfu, product, c3)

    def _current_findings(self) -> pl.DataFrame:
        since = self.now - CURRENT
        return self.store.query(
            "SELECT analyzer, kind, subject, severity, score FROM finding WHERE window_start <= ? AND window_end >= ?",
            [self.now, since], {"analyzer": pl.String, "kind": pl.String, "subject": pl.String, "severity": pl.String, "score": pl.Float64})

    def _findings(self) -> Iterator[Metric]:
        f = self._current_findings()
        gpus = self.store.read("gpu", columns=["gpu_uuid", "host"]).drop_nulls()
        gpu_host = dict(gpus.iter_rows())
        stragglers = GaugeMetricFamily("fleetscope_job_stragglers", "Ranks of the job flagged as stragglers in current findings.", labels=["job_id"])
        hung = GaugeMetricFamily("fleetscope_job_hung", "1 while the job has stopped stepping with its GPUs held (analyzers.hangs).", labels=["job_id"])
        score = GaugeMetricFamily("fleetscope_gpu_health_score", "Health score of a GPU with a current health finding (100 healthy ... 0).", labels=["UUID", "Hostname"])
        finding = GaugeMetricFamily("fleetscope_gpu_finding", "1 for each current finding about a GPU, by kind and severity.", labels=["UUID", "Hostname", "kind", "severity"])
        absent = GaugeMetricFamily("fleetscope_gpu_absent", "1 while a GPU has stopped reporting (analyzers.absence).", labels=["UUID", "Hostname"])
        down = GaugeMetricFamily("fleetscope_host_down", "1 while every GPU of the host has stopped reporting.", labels=["Hostname"])
        per_job: dict[str, int] = {}
        scores: dict[tuple[str, str], float] = {}
        for analyzer, kind, subject, severity, sc in f.iter_rows():
            if kind.startswith("straggler_") and subject.startswith("job:"):
                job = subject[4:].split("/", 1)[0]
                per_job[job] = per_job.get(job, 0) + 1
            elif kind == "job_hang":
                hung.add_metric([subject.removeprefix("job:")], 1.0)
            elif kind == "host_down":
                down.add_metric([subject.removeprefix("host:")], 1.0)
            g = _gpu_labels(subject, gpu_host)
            if g is None:
                continue
            finding.add_metric([*g, kind, severity], 1.0)
            if kind == "gpu_absent":
                absent.add_metric(list(g), 1.0)
            if analyzer == "health" and kind.startswith("gpu_") and sc is not None:
                scores[g] = min(sc, scores.get(g, 100.0))
        for job, n in sorted(per_job.items()):
            stragglers.add_metric([job], float(n))
        for g, sc in sorted(scores.items()):
            score.add_metric(list(g), sc)
        yield from (stragglers, hung, score, finding, absent, down)

    def _sites(self) -> Iterator[Metric]:
        pue = GaugeMetricFamily("fleetscope_site_pue_ratio", "Measured PUE of the site over the last 15 minutes (ISO/IEC 30134-2, interim).", labels=["site"])
        rows = self.store.query(
            "SELECT s.series, m.value, m.ts FROM metric_sample m JOIN series s ON s.series_id = m.series_id "
            "WHERE s.name = ? AND m.ts >= ? AND m.ts <= ? ORDER BY m.ts",
            [PUE_SERIES, self.now - CURRENT, self.now], {"series": pl.String, "value": pl.Float64, "ts": F.UTC_US})
        latest = rows.unique("series", keep="last")
        for series, value, _ in latest.sort("series").iter_rows():
            pue.add_metric([F.parse_series_key(series)[1].get("site", "")], value)
        power = GaugeMetricFamily("fleetscope_site_gpu_power_watts", "GPU power of the site over its last complete rolled-up minute.", labels=["site"])
        gpus = GaugeMetricFamily("fleetscope_site_gpus_reporting", "GPUs of the site with energy data in its last rolled-up minute.", labels=["site"])
        # the minute before the current one is still filling (scrapes lag by an interval): read up to the one before
        last = floor_minute(self.now) - dt.timedelta(minutes=1)
        mins = self.store.query("SELECT minute, site_id, energy_j, gpus FROM site_energy_minute WHERE minute >= ? AND minute < ?",
                                [last - dt.timedelta(minutes=10), last],
                                {"minute": F.UTC_US, "site_id": pl.String, "energy_j": pl.Float64, "gpus": pl.Int64})
        for _, site, energy_j, n in mins.sort("minute").unique("site_id", keep="last").sort("site_id").iter_rows():
            if energy_j is not None:
                power.add_metric([site], energy_j / 60.0)
            if n is not None:
                gpus.add_metric([site], float(n))
        yield from (pue, power, gpus)


def exposition(store: Store, now: dt.datetime | None = None) -> bytes:
    """The fleet series as Prometheus text exposition (format 0.0.4)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_FleetCollector(store, now or dt.datetime.now(dt.UTC)))
    return generate_latest(registry)
