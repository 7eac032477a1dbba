"""`fleetscope agent`: the node-side collector. Polls dcgm-exporter endpoints and/or NVML on an interval
and pushes what it reads to the Fleetscope API, so GPU hosts need no database access.

Two ways to push (``push``):

- ``otlp`` (default): the readings go out as OpenTelemetry metrics, through the OpenTelemetry SDK's
  ``MeterProvider`` and the OTLP exporter's protobuf encoder, gzipped, to the server's ``POST /v1/metrics``
  with the token as a bearer header. Names are the ones ``ingest.otlp`` reads back
  (``ingest.otlp_export.GPU_EXPORT``: the semconv ``hw.*`` metrics where they exist, DCGM field names otherwise),
  so the same agent can also feed any OTLP receiver, e.g. an OpenTelemetry Collector. The resource says
  ``service.name`` ``fleetscope-agent`` and ``host.name``; each point carries the GPU as ``hw.id``. Each
  tick collects once into one request, whose points are stamped with the tick's time (when the sources
  were read), not with the time the request happens to be sent.
- ``batch``: the exporter's body is forwarded to ``POST /api/v1/ingest/dcgm`` with the scrape time as
  ``ts`` and NVML readings (which carry their own ``ts``) go to ``POST /api/v1/batches``: everything the
  parsers read, including DCGM fields without a gpu_sample column (kept as metric_sample series), which
  OTLP mode does not send.

With ``infiniband`` (the ``/sys/class/infiniband`` directory; ``fleetscope agent`` turns it on where the
directory exists) each tick also reads the RDMA devices' port counters there (``read_infiniband``) and
sends them, mapped by ``ingest.ib_sysfs``, as ``fabric_port_sample`` rows to ``POST /api/v1/batches``, in
either push mode (OTLP has no names for them).

With ``slurm_urls`` each tick also polls slurmrestd (``GET /slurm/<data_parser>/jobs`` and ``/nodes``, e.g.
``v0.0.40``, and where ``slurm_endpoints`` asks for them ``/slurm/<v>/partitions``, slurmdbd's ``/slurmdb/<v>/jobs``
and ``/slurmdb/<v>/accounts``; with ``X-SLURM-USER-NAME`` / ``X-SLURM-USER-TOKEN`` where a token is given, as slurmrestd's
``rest_auth/jwt`` expects) and sends each answer as it is to ``POST /api/v1/ingest/slurmrestd``, stamped with
the poll time, in either push mode. A body over ``slurm_max_bytes``, one that is not JSON, or one without its
``jobs`` / ``nodes`` list (slurmrestd's ``errors``) is that source's error for the tick and is not sent.

With ``probe_every_s`` the agent also runs the SDC known-answer probe (``fleetscope.agent.probing``) on the
node's GPUs (``probe_backend``: ``auto`` takes torch or cupy where one reaches a GPU, else says so and probes the
CPU with numpy) that often, in a thread of its own so that a round never delays a tick, and sends each
result as the ``sdc_probe`` health event ``fleetscope health probe`` records (``analyzers.sdc_probe.probe_event``,
stamped with the tick that started the round), which the health sweep's SDC screen reads. They go to
``POST /api/v1/batches`` in either push mode: OTLP metrics carry numbers, and the server derives health
events from them only for DCGM's fault counters (XID, ECC, row remap), so a probe's verdict with its digests
has no OTLP form. A probe that cannot run, or raises, is that tick's ``probe`` error; the next round tries again.

A failed scrape is logged and counted, and the next tick goes on: one exporter down must not stop the
others. A refused token (401/403) stops the agent, since every later push would be refused too.

What could not be delivered is kept (``Backlog``): a push that fails for a reason that may pass
(connection refused or reset, timeout, 408, 429, 5xx) leaves the tick's readings as the very request that
would deliver them, measurement time included, and they are sent again later, oldest first. The backlog is
bounded by bytes and by ticks; when full, the oldest readings are dropped, logged and counted. With a spool
directory every kept request is also a file, so an agent restart loses nothing either. A reading the API
refuses as bad data (another 4xx, or 413: too large) would be refused again: it is logged, counted and
dropped. Retries back off exponentially with jitter (capped at ``backoff_cap_s``; a ``Retry-After`` the
server sends is honoured) and never hold up collection: each tick collects first, then sends what is
waiting, oldest first, until the next tick is due. Several waiting NVML batches go together in one
request (their frames concatenate) up to ``merge_bytes``; exporter bodies each have their own ``ts``, and
OTLP requests each carry one tick (the server takes a GPU's pod attribution from its first point in a
request, so merged ticks would lose the later ticks' ``gpu_workload`` rows): those go one request each,
back to back. Re-sending is safe:
stored rows are keyed by GPU and time, so a request the server wrote but whose answer was lost writes
nothing new the second time.
"""

from __future__ import annotations

import datetime as dt
import gzip
import json
import logging
import math
import random
import re
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from email.utils import parsedate_to_datetime
from pathlib import Path
from typing import Any

import httpx
import polars as pl

from analyzers.sdc_probe import probe_event
from fleetscope.agent.backlog import Backlog, Reading, raw_size
from fleetscope.agent.otlp import OtlpEncoder
from fleetscope.agent.probing import PROBE_BACKENDS, Prober, targets as probe_targets
from ingest import dcgm
from fleetscope.devices import nvml as nvml_driver
from ingest import nvml
from fleetscope.core import frames as F
from fleetscope.core.frames import batch_to_json
from ingest import ib_sysfs
from ingest.otlp_export import gpu_observations
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceResponse

log = logging.getLogger("fleetscope.agent")

PUSH_MODES = ("otlp", "batch")
DEFAULT_BUFFER_MB = 64
DEFAULT_BUFFER_TICKS = 360  # an hour at the default 10 s interval
BACKOFF_BASE_S = 1.0
BACKOFF_CAP_S = 30.0
RETRY_AFTER_CAP_S = 300.0  # a Retry-After beyond this is taken as this: a bad header must not silence the agent
MERGE_BYTES = 4 * 2**20  # uncompressed bytes of one request that carries several waiting readings
SLURM_API_VERSION = "v0.0.40"
# What the agent may poll: name -> (path under the base URL, with the data_parser version, and the list its answer holds)
SLURM_PATHS = {"jobs": ("slurm/{v}/jobs", "jobs"), "nodes": ("slurm/{v}/nodes", "nodes"), "partitions": ("slurm/{v}/partitions", "partitions"),
               "accounting": ("slurmdb/{v}/jobs", "jobs"), "accounts": ("slurmdb/{v}/accounts", "accounts")}
SLURM_ENDPOINTS = ("jobs", "nodes")
SLURM_MAX_BYTES = 256 * 2**20  # the server's slurmrestd parser refuses more (ingest.slurmrestd.MAX_INPUT_BYTES)
_SLURM_VERSION = re.compile(r"^v0\.0\.\d{2}$")


class AgentStopped(RuntimeError):
    pass


@dataclass
class TickReport:
    ts: dt.datetime
    pushed: dict[str, dict[str, int]] = field(default_factory=dict)
    errors: dict[str, str] = field(default_factory=dict)
    points: int = 0  # OTLP data points collected this tick
    rejected_points: int = 0  # of the points delivered this tick, those the receiver refused (OTLP partial success)
    replayed: int = 0  # readings of earlier ticks delivered during this tick
    buffered: int = 0  # readings waiting to be sent after this tick
    buffered_bytes: int = 0
    dropped: int = 0  # waiting readings dropped this tick to stay within the backlog's bounds, oldest first
    discarded: int = 0  # readings the API refused as bad data or too large this tick: not sent again
    probes: list[dict[str, Any]] = field(default_factory=list)  # probe results (or why a device's could not run) taken this tick


def _retry_after(resp: httpx.Response) -> float | None:
    """Seconds from a ``Retry-After`` header (delta-seconds or an HTTP date, RFC 9110 10.2.3)."""
    value = resp.headers.get("retry-after")
    if not value:
        return None
    try:
        seconds = float(value)
    except ValueError:
        try:
            when = parsedate_to_datetime(value)
        except (TypeError, ValueError):
            return None
        if when.tzinfo is None:
            when = when.replace(tzinfo=dt.UTC)
        seconds = (when - dt.datetime.now(dt.UTC)).total_seconds()
    if not math.isfinite(seconds):
        return None
    return min(max(seconds, 0.0), RETRY_AFTER_CAP_S)


IB_MAX_FILES = 20_000  # 64 devices x a few ports x ~60 attributes, with room; a bigger tree is not sysfs


def read_infiniband(root: str | Path) -> dict[str, str]:
    """The attributes ``ingest.ib_sysfs`` reads from a ``/sys/class/infiniband`` tree: path relative to
    ``root`` -> text. Device entries there are symlinks into ``/sys/devices``; they are followed one level
    (the device), never below (sysfs has cycles)."""
    base = Path(root)
    out: dict[str, str] = {}
    for dev in sorted(base.iterdir()):
        names = [f"{dev.name}/node_guid"]
        ports = dev / "ports"
        if ports.is_dir():
            for port in sorted(p for p in ports.iterdir() if p.name.isdigit()):
                rel = f"{dev.name}/ports/{port.name}"
                names += [f"{rel}/{a}" for a in ("rate", "state", "phys_state", "link_layer", "lid")]
                for group in ("counters", "counters_ext", "hw_counters"):
                    d = port / group
                    if d.is_dir() and not d.is_symlink():
                        names += [f"{rel}/{group}/{f.name}" for f in sorted(d.iterdir())]
        for name in names:
            if len(out) >= IB_MAX_FILES:
                raise ValueError(f"more than {IB_MAX_FILES} attributes under {base}: not an InfiniBand sysfs tree")
            f = base / name
            try:
                if f.is_file():
                    out[name] = f.read_text(errors="replace")[:4096]
            except OSError:  # a counter the driver cannot read now (EINVAL, EIO) is missing, not fatal
                continue
    return out


@dataclass
class Agent:
    api_url: str
    token: str
    dcgm_urls: list[str] = field(default_factory=list)
    nvml: bool = False
    host: str = field(default_factory=socket.gethostname)
    infiniband: str | Path | None = None  # the sysfs directory of the RDMA devices
    serving_urls: list[str] = field(default_factory=list)  # inference servers' /metrics (vLLM, SGLang, TGI, Triton, NIM)
    slurm_urls: list[str] = field(default_factory=list)  # slurmrestd base URLs (http://slurmctld:6820)
    slurm_api_version: str = SLURM_API_VERSION  # the data_parser version in the path: /slurm/v0.0.40/jobs
    slurm_user: str | None = None  # X-SLURM-USER-NAME
    slurm_token: str | None = None  # X-SLURM-USER-TOKEN (a JWT from `scontrol token`)
    slurm_max_bytes: int = SLURM_MAX_BYTES
    slurm_endpoints: tuple[str, ...] = SLURM_ENDPOINTS  # of SLURM_PATHS: accounts give team rules by organization
    timeout_s: float = 10.0
    push: str = "otlp"
    buffer_bytes: int = DEFAULT_BUFFER_MB * 2**20
    buffer_ticks: int = DEFAULT_BUFFER_TICKS
    spool: str | Path | None = None
    backoff_cap_s: float = BACKOFF_CAP_S
    merge_bytes: int = MERGE_BYTES
    probe_every_s: float | None = None  # run the SDC known-answer probe on the node's GPUs this often (None: never)
    probe_backend: str = "auto"  # of probing.PROBE_BACKENDS
    probe_wait_s: float | None = None  # let a round finish within the tick that starts it, up to this long (--once)
    clock: Callable[[], float] = time.monotonic  # for retry times and tick budgets; tests inject their own
    sleep: Callable[[float], None] = time.sleep
    rng: random.Random = field(default_factory=random.Random)

    def __post_init__(self) -> None:
        if self.push not in PUSH_MODES:
            raise ValueError(f"push must be one of {', '.join(PUSH_MODES)}, not {self.push!r}")
        if not _SLURM_VERSION.match(self.slurm_api_version or ""):
            raise ValueError(f"the slurmrestd data_parser version looks like v0.0.40, not {str(self.slurm_api_version)[:40]!r}")
        unknown = [e for e in self.slurm_endpoints if e not in SLURM_PATHS]
        if unknown or not self.slurm_endpoints:
            raise ValueError(f"slurmrestd endpoints are some of {', '.join(SLURM_PATHS)}, not {', '.join(map(str, unknown))[:100] or 'none'}")
        self.prober: Prober | None = None
        self.probe_note: str | None = None  # auto found no GPU backend: why the probe runs on the CPU
        if self.probe_every_s is not None:
            if self.probe_backend not in PROBE_BACKENDS:
                raise ValueError(f"probe backend must be one of {', '.join(PROBE_BACKENDS)}, not {str(self.probe_backend)[:40]!r}")
            found, self.probe_note = probe_targets(self.probe_backend)  # ProbeUnavailable where torch or cupy was asked for and cannot run
            if self.probe_note:
                log.warning("%s", self.probe_note)
            self.prober = Prober(found, self.probe_every_s, self.clock)
        self.client = httpx.Client(timeout=self.timeout_s, headers={"Authorization": f"Bearer {self.token}"})
        self.otlp = OtlpEncoder(host=self.host) if self.push == "otlp" else None
        self.backlog = Backlog(self.buffer_bytes, self.buffer_ticks, self.spool)
        self.retry_at = -math.inf  # clock time before which no send is tried
        self.failures = 0  # failed sends in a row
        self.last_error = ""
        self.discarded = 0  # readings refused for good since start
        self._solo = 0  # how many of the oldest readings go one request each (after a merged request was refused)

    # --- collection ---------------------------------------------------------------------------------

    def _source(self, report: TickReport, name: str, read: Callable[[], Any]) -> Any:
        try:
            return read()
        except AgentStopped:
            raise
        except Exception as exc:  # noqa: BLE001 - reported, and the other sources go on
            report.errors[name] = str(exc).splitlines()[0][:300] or type(exc).__name__
            log.warning("%s: %s", name, report.errors[name])
            return None

    def collect(self, report: TickReport) -> list[Reading]:
        """Read every source once; the readings as the requests that will deliver them."""
        now = report.ts
        out: list[Reading] = []
        sources: dict[str, dict[str, int]] = {}
        for url in self.dcgm_urls:
            r = self._source(report, url, lambda url=url: self._dcgm(url, now))
            if isinstance(r, Reading):
                out.append(r)
            elif r is not None:
                sources[url] = r
        if self.nvml:
            r = self._source(report, "nvml", lambda: self._nvml(now))
            if isinstance(r, Reading):
                out.append(r)
            elif r is not None:
                sources["nvml"] = r
        if self.infiniband is not None:
            r = self._source(report, "infiniband", lambda: self._infiniband(now))
            if isinstance(r, Reading):
                out.append(r)
            elif r is not None:
                report.pushed["infiniband"] = r
        for url in self.serving_urls:
            r = self._source(report, url, lambda url=url: self._serving(url, now))
            if r is not None:
                out.append(r)
        for base in self.slurm_urls:
            for endpoint in self.slurm_endpoints:
                path, what = SLURM_PATHS[endpoint]
                url = f"{base.rstrip('/')}/{path.format(v=self.slurm_api_version)}"
                r = self._source(report, url, lambda url=url, what=what: self._slurm(url, what, now))
                if r is not None:
                    out.append(r)
        if self.prober is not None:
            r = self._source(report, "probe", lambda: self._probe(report))
            if r is not None:
                out.append(r)
        if self.otlp is not None and sources:
            report.points = sum(p.get("points", 0) for p in sources.values())
            body = self.otlp.encode(now)
            if body is None:  # sources read fine but held no GPU samples: nothing to send
                report.pushed.update(sources)
            else:
                out.append(Reading(now, "/v1/metrics", gzip.compress(body, 6), "application/x-protobuf", "",
                                   sources=sources, gzipped=True))
        return out

    def _dcgm(self, url: str, now: dt.datetime) -> Reading | dict[str, int]:
        body = self.client.get(url).raise_for_status().content
        if self.push == "batch":
            # gzip: the API inflates it (it sniffs the magic), and a backlog of scrapes takes a tenth of the room
            return Reading(now, "/api/v1/ingest/dcgm", gzip.compress(body, 6), "text/plain", "",
                           params={"ts": now.isoformat(), "source": url}, sources={url: {}})

        return self._queue(dcgm.parse(body, source=url, ts=now))

    def _serving(self, url: str, now: dt.datetime) -> Reading:
        """An inference server's body as it is, to the ingest route's detection (the server is told by its
        names), stamped with the scrape time; the URL is the replica's name unless the body's labels give one."""
        body = self.client.get(url).raise_for_status().content
        return Reading(now, "/api/v1/ingest/auto", gzip.compress(body, 6), "text/plain", "",
                       params={"ts": now.isoformat(), "source": url}, sources={url: {}})

    def _slurm(self, url: str, what: str, now: dt.datetime) -> Reading:
        """One slurmrestd endpoint's answer, checked to be a slurmrestd ``what`` document, as a reading for
        the ingest route's slurmrestd parser; read no further than ``slurm_max_bytes``."""
        headers = {"Accept": "application/json"}
        if self.slurm_user:
            headers["X-SLURM-USER-NAME"] = self.slurm_user
        if self.slurm_token:
            headers["X-SLURM-USER-TOKEN"] = self.slurm_token
        limit = self.slurm_max_bytes
        with self.client.stream("GET", url, headers=headers) as resp:
            if resp.status_code in (401, 403):
                raise ValueError(f"slurmrestd refused the request ({resp.status_code}): give a user and token (--slurm-user, --slurm-token)")
            resp.raise_for_status()
            declared = resp.headers.get("content-length", "")
            if declared.isdigit() and int(declared) > limit:
                raise ValueError(f"answer of {int(declared)} bytes is over the {limit}-byte limit")
            chunks, size = [], 0
            for chunk in resp.iter_bytes():
                size += len(chunk)
                if size > limit:
                    raise ValueError(f"answer over the {limit}-byte limit")
                chunks.append(chunk)
        body = b"".join(chunks)
        try:
            doc = json.loads(body)
        except (ValueError, RecursionError):
            raise ValueError(f"answer is not JSON ({len(body)} bytes starting {body[:40]!r})") from None
        if not isinstance(doc, dict) or not isinstance(doc.get(what), list):
            errors = doc.get("errors") if isinstance(doc, dict) else None
            why = f"slurmrestd answered with errors: {json.dumps(errors)[:300]}" if errors else f"no {what} list: not a slurmrestd {what} answer"
            raise ValueError(why)
        return Reading(now, "/api/v1/ingest/slurmrestd", gzip.compress(body, 6), "application/json", "",
                       params={"ts": now.isoformat(), "source": url}, sources={url: {}})

    def _nvml(self, now: dt.datetime) -> Reading | dict[str, int]:
        batch = nvml.to_batch(nvml_driver.read_devices(), ts=now, host=self.host, xids=nvml_driver.xid_events(0), source=f"nvml:{self.host}")
        if self.push == "batch":
            body = json.dumps(batch_to_json(batch), default=str).encode()
            return Reading(now, "/api/v1/batches", body, "application/json", f"batch:{batch.source}", sources={"nvml": {}})
        return self._queue(batch)

    def _infiniband(self, now: dt.datetime) -> Reading | dict[str, int]:
        assert self.infiniband is not None
        batch = ib_sysfs.from_files(read_infiniband(self.infiniband), ts=now, host=self.host, source=f"sysfs:{self.host}")
        if batch.fabric_port_sample is None:
            return {"fabric_port_sample": 0}
        body = json.dumps(batch_to_json(batch), default=str).encode()
        return Reading(now, "/api/v1/batches", body, "application/json", f"batch:{batch.source}", sources={"infiniband": {}})

    def _probe(self, report: TickReport) -> Reading | None:
        """The probe results finished since the last tick as ``sdc_probe`` health events, one request; a
        round is started when one is due (``probing.Prober``). Devices whose probe failed to run, and a
        round still running when the next is due, are this tick's ``probe`` error."""
        assert self.prober is not None
        done, note = self.prober.poll(report.ts, wait=self.probe_wait_s)
        report.probes.extend(o.to_dict(self.host) for o in done)
        errors = [f"{o.target.label}: {o.error}" for o in done if o.result is None] + ([note] if note else [])
        if errors:
            report.errors["probe"] = "; ".join(errors)[:300]
            log.warning("probe: %s", report.errors["probe"])
        rows = [probe_event(o.result, ts=o.ts, host=self.host, gpu_uuid=o.target.subject(o.result, self.host)) for o in done if o.result is not None]
        if not rows:
            return None
        batch = F.Batch(source=f"probe:{self.host}", health_event=pl.concat(rows))
        # /api/v1/batches in both push modes: an OTLP metric cannot carry the verdict's digests (the module's docstring)
        body = json.dumps(batch_to_json(batch), default=str).encode()
        return Reading(report.ts, "/api/v1/batches", body, "application/json", f"batch:{batch.source}", sources={"probe": {}})

    def _queue(self, batch: Any) -> dict[str, int]:
        assert self.otlp is not None
        points = self.otlp.add(gpu_observations(batch))
        return {"gpu_sample": batch.gpu_sample.height if batch.gpu_sample is not None else 0, "points": points}

    # --- delivery -----------------------------------------------------------------------------------

    def tick(self, now: dt.datetime | None = None, *, deadline: float | None = None) -> TickReport:
        """Collect once, then send what is waiting, oldest first and this tick's readings last, until the
        clock reaches ``deadline`` (no limit when None) or a send fails."""
        now = now or dt.datetime.now(dt.UTC)
        report = TickReport(ts=now)
        fresh = self.collect(report)
        for r in fresh:
            self._keep(r, report)
        self.drain(report, deadline=deadline)
        waiting = {id(r) for r in self.backlog.items}
        for r in fresh:
            if id(r) in waiting:
                for name in r.sources:
                    why = self.last_error if self.failures else "older readings were still being sent when the tick's time ran out"
                    report.errors.setdefault(name, f"not delivered yet, kept to resend ({why})")
        report.buffered, report.buffered_bytes = len(self.backlog), self.backlog.nbytes
        return report

    def _keep(self, r: Reading, report: TickReport) -> None:
        dropped = self.backlog.add(r)
        if dropped:
            report.dropped += len(dropped)
            log.warning("backlog full (%d readings, %.1f MiB, %d ticks): dropped the %d oldest, measured %s to %s; %d dropped since start",
                        len(self.backlog), self.backlog.nbytes / 2**20, self.backlog.ticks, len(dropped),
                        dropped[0].ts.isoformat(), dropped[-1].ts.isoformat(), self.backlog.dropped)
            for d in dropped:
                if d.ts == report.ts:
                    for name in d.sources:
                        report.errors[name] = "dropped: larger than the whole backlog"

    def drain(self, report: TickReport, *, deadline: float | None = None) -> None:
        """Send waiting readings, oldest first, while sends succeed, the retry time has come, and the
        clock is short of ``deadline``."""
        while self.backlog:
            t = self.clock()
            if t < self.retry_at or (deadline is not None and t >= deadline):
                return
            batch = self.backlog.head(self.merge_bytes, 1 if self._solo else None)
            timeout = self.timeout_s if deadline is None else min(self.timeout_s, max(1.0, deadline - t))
            try:
                resp = self._post(batch, timeout)
            except httpx.TransportError as exc:  # refused, reset, timed out: the API may come back
                self._retry_later(f"{type(exc).__name__}: {str(exc)[:200]}", None, batch)
                return
            status = resp.status_code
            if 200 <= status < 300:
                self._delivered(batch, resp, report)
                continue
            what = f"API answered {status} on {batch[0].path}: {resp.text[:300]}"
            if status in (401, 403):
                raise AgentStopped(f"the API refused the token ({status}) while pushing {', '.join(batch[0].sources) or batch[0].path}: {resp.text[:200]}")
            if status in (408, 429) or status >= 500:
                self._retry_later(what, _retry_after(resp), batch)
                return
            if len(batch) > 1:
                # One request for several readings was refused: send them one by one, so that only the
                # one at fault (if any) is dropped; a 413 also says requests must be smaller from now on.
                self._solo = len(batch)
                if status == 413:
                    self.merge_bytes = max(1, sum(raw_size(r) for r in batch) // 2)
                log.info("%s; sending the %d readings it carried one by one", what, len(batch))
                continue
            self._discard(batch[0], report, what)

    def _post(self, batch: list[Reading], timeout: float) -> httpx.Response:
        first = batch[0]
        headers = {"Content-Type": first.content_type}
        if len(batch) == 1:
            body, gz = first.body, first.gzipped
        else:  # NVML batches of one source: the frames concatenate
            frames: dict[str, list[Any]] = {}
            doc: dict[str, Any] = {}
            for r in batch:
                doc = json.loads(r.raw())
                for name, records in doc["frames"].items():
                    frames.setdefault(name, []).extend(records)
            body, gz = json.dumps({"source": doc.get("source"), "frames": frames}).encode(), False
        if gz and first.path == "/v1/metrics":  # the ingest route sniffs gzip itself
            headers["Content-Encoding"] = "gzip"
        return self.client.post(f"{self.api_url}{first.path}", content=body, params=first.params, headers=headers, timeout=timeout)

    def _delivered(self, batch: list[Reading], resp: httpx.Response, report: TickReport) -> None:
        self.backlog.remove(batch)
        self.failures, self.retry_at = 0, -math.inf
        self._solo = max(0, self._solo - len(batch))
        if batch[0].path == "/v1/metrics":
            try:
                report.rejected_points += int(ExportMetricsServiceResponse.FromString(resp.content).partial_success.rejected_data_points)
            except Exception:  # noqa: BLE001 - an empty or foreign 2xx body means nothing was rejected
                pass
            written = None
        else:
            try:
                written = resp.json().get("written", {})
            except (ValueError, AttributeError):
                written = {}
        for r in batch:
            if r.ts == report.ts:
                for name, counts in r.sources.items():
                    report.pushed[name] = counts if written is None else written
            else:
                report.replayed += 1

    def _retry_later(self, why: str, retry_after: float | None, batch: list[Reading]) -> None:
        self.failures += 1
        # exponential backoff with "equal jitter": between half and all of the capped delay; a Retry-After
        # from the server is the least wait (so "Retry-After: 0" cannot make the agent hammer a busy API)
        cap = min(self.backoff_cap_s, BACKOFF_BASE_S * 2 ** min(self.failures - 1, 30))
        delay = self.rng.uniform(cap / 2, cap)
        if retry_after is not None:
            delay = max(delay, retry_after)
        self.retry_at = self.clock() + delay
        self.last_error = why.splitlines()[0][:300] if why else "send failed"
        log.warning("push failed (%s): %d readings (%.1f MiB, oldest measured %s) kept; next try in %.1f s",
                    self.last_error, len(self.backlog), self.backlog.nbytes / 2**20, batch[0].ts.isoformat(), delay)

    def _discard(self, r: Reading, report: TickReport, why: str) -> None:
        self.backlog.remove([r])
        self._solo = max(0, self._solo - 1)
        self.discarded += 1
        report.discarded += 1
        what = "too large for the API (413); not split" if why.startswith("API answered 413") else "refused as bad data; it would be refused again"
        log.error("dropped the reading of %s measured %s: %s: %s", ", ".join(r.sources) or r.path, r.ts.isoformat(), what, why)
        if r.ts == report.ts:
            for name in r.sources:
                report.errors[name] = f"dropped, {what}: {why}"[:300]

    # --- lifecycle ----------------------------------------------------------------------------------

    def close(self) -> None:
        if self.backlog and self.backlog.spool is None:
            log.warning("%d readings (oldest measured %s) were never delivered and are lost; --spool DIR keeps them across restarts",
                        len(self.backlog), self.backlog.items[0].ts.isoformat())
        self.client.close()
        if self.otlp is not None:
            self.otlp.close()

    def run(self, interval_s: float, *, ticks: int | None = None, on_tick: Any = None) -> None:
        """Tick every ``interval_s`` on a fixed schedule (a slow tick does not shift the next ones). Between
        ticks, waiting readings are sent as soon as their retry time comes, never past the next tick's."""
        n = 0
        next_at = self.clock()
        while ticks is None or n < ticks:
            next_at += interval_s
            report = self.tick(deadline=next_at)
            if on_tick:
                on_tick(report)
            n += 1
            if ticks is not None and n >= ticks:
                return
            while (left := next_at - self.clock()) > 0:
                if self.backlog and self.retry_at < next_at:
                    self.sleep(min(left, max(0.0, self.retry_at - self.clock())))
                    between = TickReport(ts=dt.datetime.now(dt.UTC))
                    self.drain(between, deadline=next_at)
                    if between.replayed:
                        log.info("sent %d waiting readings; %d still waiting", between.replayed, len(self.backlog))
                else:
                    self.sleep(left)
