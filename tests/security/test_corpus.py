"""A hostile corpus against a running ``fleetscope serve``: for every case, the answer is the refusal it should
be (never a 5xx), it comes within 2 s, the server's memory does not grow by 100 MB while answering, and
nothing stored changes.

The server is the real command in its own process (so its memory is measured apart from the test's), with a
1 MiB body limit so the oversize cases stay cheap. Each case names what an attacker tries; the expected
status is the one a careful service gives, and a case whose answer drifts fails with the body it got.
"""

from __future__ import annotations

import datetime as dt
import gzip
import json
import os
import subprocess
import sys
import threading
import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field

import cramjam
import httpx
import psutil
import pytest

from benchmarks._server import free_port, wait_healthy
from fleetscope.services import auth
from fleetscope.store import db
from fleetscope.store import Store

pytestmark = pytest.mark.slow

T = "2026-03-01T12:00:00Z"
DCGM = (b'# TYPE DCGM_FI_DEV_GPU_TEMP gauge\n'
        b'DCGM_FI_DEV_GPU_TEMP{gpu="0",UUID="GPU-aaaa",device="nvidia0",modelName="NVIDIA H100 80GB HBM3",Hostname="n1"} 41\n')
FROZEN = ("gpu_sample", "metric_sample", "series", "gpu", "host", "site", "finding", "health_event", "job_event", "job_analysis",
          "nccl_test", "api_token", "alert_silence", "alert_receiver", "alert_rule", "dataset_registry", "model", "fairness_evaluation",
          "aiact_declaration", "lineage_event", "audit_log")
MAX_S = 2.0
MAX_RSS_GROWTH = 100 * 2**20


@dataclass
class Case:
    name: str
    method: str
    path: str
    token: str | None = "admin"  # which token to send: a scope, "none", or a raw Authorization value via headers
    status: int | tuple[int, ...] = 400
    body: bytes | Callable[[], bytes] = b""
    headers: dict[str, str] = field(default_factory=dict)
    params: dict[str, str] = field(default_factory=dict)
    contains: str = ""


def _gzip_bomb(size: int = 512 * 2**20) -> bytes:
    # a 512 MiB body of zeros compresses to about 0.5 MiB: under the 1 MiB limit, far over it inflated
    z = zlib.compressobj(9, zlib.DEFLATED, 31)
    chunk = b"\0" * 2**20
    return b"".join(z.compress(chunk) for _ in range(size // 2**20)) + z.flush()


_BOMB = None


def bomb() -> bytes:
    global _BOMB
    if _BOMB is None:
        _BOMB = _gzip_bomb()
    return _BOMB


def _billion_laughs() -> bytes:
    ents = "".join(f'<!ENTITY l{i} "{"&l%d;" % (i - 1) * 10 if i else "lol"}">' for i in range(10))
    return f'<?xml version="1.0"?><!DOCTYPE nvidia_smi_log [{ents}]><nvidia_smi_log><gpu><product_name>&l9;</product_name></gpu></nvidia_smi_log>'.encode()


def _utf16_entity() -> bytes:
    doc = '<?xml version="1.0" encoding="UTF-16"?><!DOCTYPE x [<!ENTITY e "INJECTED">]><nvidia_smi_log><gpu id="0"><product_name>&e;</product_name></gpu></nvidia_smi_log>'
    return doc.encode("utf-16")


def _snappy_liar() -> bytes:
    # a snappy block whose preamble claims 4 GiB uncompressed: must be refused before allocating
    return bytes([0x80, 0x80, 0x80, 0x80, 0x10]) + b"\x00" * 16


def _protobuf_garbage() -> bytes:
    return b"\x0a\xff\xff\xff\xff\x0f" + os.urandom(64)


def _deep(n: int = 100_000) -> bytes:
    return b"[" * n + b"]" * n


def _future_batch() -> bytes:
    ts = (dt.datetime.now(dt.UTC) + dt.timedelta(days=365)).isoformat()
    return json.dumps({"frames": {"gpu_sample": [{"ts": ts, "gpu_uuid": "GPU-aaaa", "temp_c": 1.0}]}}).encode()


J = {"Content-Type": "application/json"}
CASES = [
    # --- who you are --------------------------------------------------------------------------------
    *[Case(f"no token: {m} {p}", m, p, token=None, status=401) for m, p in [
        ("GET", "/api/v1/counts"), ("POST", "/api/v1/ingest/dcgm"), ("POST", "/api/v1/batches"), ("POST", "/v1/metrics"),
        ("POST", "/api/v1/write"), ("PUT", "/api/v1/datasets"), ("POST", "/api/v1/tokens"), ("GET", "/api/v1/alerts/receivers"),
        ("POST", "/api/v1/exports"), ("GET", "/api/v1/fleet/metrics"), ("GET", "/metrics"), ("GET", "/api/v1/auditlog/verify")]],
    Case("basic auth instead of bearer", "GET", "/api/v1/counts", token=None, status=401, headers={"Authorization": "Basic YWRtaW46YWRtaW4="}),
    Case("bearer with no token", "GET", "/api/v1/counts", token=None, status=401, headers={"Authorization": "Bearer"}),
    Case("10 KB bearer", "GET", "/api/v1/counts", token=None, status=401, headers={"Authorization": "Bearer fs_" + "A" * 10_000}),
    Case("bearer with UTF-8 bytes", "GET", "/api/v1/counts", token=None, status=401, headers={"Authorization": b"Bearer fs_\xc3\xa9\xc3\xa9"}),
    Case("bearer with a control character", "GET", "/api/v1/counts", token=None, status=400, headers={"Authorization": b"Bearer fs_\x01x"}),
    Case("revoked token", "GET", "/api/v1/counts", token="revoked", status=401),
    Case("expired token", "GET", "/api/v1/counts", token="expired", status=401),
    # --- what you may do ----------------------------------------------------------------------------
    Case("read token pushes telemetry", "POST", "/api/v1/ingest/dcgm", token="read", status=403, body=DCGM, params={"ts": T}),
    Case("ingest token reads receivers", "GET", "/api/v1/alerts/receivers", token="ingest", status=403),
    Case("ingest token registers a dataset", "PUT", "/api/v1/datasets", token="ingest", status=403, headers=J,
         body=b'{"namespace": "s3://x", "name": "d"}'),
    Case("governance token mints a token", "POST", "/api/v1/tokens", token="governance", status=403, headers=J,
         body=b'{"name": "x", "scopes": ["admin"]}'),
    Case("read token creates a silence", "POST", "/api/v1/alerts/silences", token="read", status=403, headers=J,
         body=b'{"matchers": [{"name": "a", "value": "b", "isRegex": false}], "endsAt": "2099-01-01T00:00:00Z", "comment": "x"}'),
    Case("ingest token writes a finding", "POST", "/api/v1/batches", token="ingest", status=403, headers=J,
         body=json.dumps({"frames": {"finding": [{"analyzer": "sdc", "kind": "sdc_suspect", "subject": "gpu:G", "window_start": T,
                                                  "severity": "info"}]}}).encode()),
    Case("ingest token changes a site's PUE", "POST", "/api/v1/batches", token="ingest", status=403, headers=J,
         body=b'{"frames": {"site": [{"site_id": "dc1", "declared_pue": 1.0}]}}'),
    Case("ingest token rewrites an analysis", "POST", "/api/v1/batches", token="ingest", status=403, headers=J,
         body=json.dumps({"frames": {"job_analysis": [{"job_id": "j", "analyzer": "goodput", "computed_at": T, "result": "{}"}]}}).encode()),
    Case("host-bound token writes another host", "POST", "/api/v1/ingest/dcgm", token="bound", status=403, body=DCGM, params={"ts": T}),
    Case("read token scrapes admin tokens list", "GET", "/api/v1/tokens", token="read", status=403),
    Case("mint a token with an unknown scope", "POST", "/api/v1/tokens", status=422, headers=J, body=b'{"name": "x", "scopes": ["root"]}'),
    # --- oversized, compressed, encoded ---------------------------------------------------------------
    Case("2 MiB body over the 1 MiB limit", "POST", "/api/v1/ingest/dcgm", token="ingest", status=413, body=b"#" * (2 * 2**20), params={"ts": T}),
    Case("chunked body over the limit", "POST", "/api/v1/ingest/dcgm", token="ingest", status=413, params={"ts": T},
         body=lambda: b"#" * (2 * 2**20), headers={"Transfer-Encoding": "chunked"}),
    Case("gzip bomb to the dcgm ingest", "POST", "/api/v1/ingest/dcgm", token="ingest", status=413, body=bomb,
         headers={"Content-Encoding": "gzip"}, params={"ts": T}),
    Case("gzip bomb to OTLP", "POST", "/v1/metrics", token="ingest", status=413, body=bomb,
         headers={"Content-Encoding": "gzip", "Content-Type": "application/x-protobuf"}),
    Case("truncated gzip", "POST", "/api/v1/ingest/dcgm", token="ingest", status=400, body=gzip.compress(DCGM)[:-12],
         headers={"Content-Encoding": "gzip"}, params={"ts": T}),
    Case("not gzip at all", "POST", "/api/v1/ingest/dcgm", token="ingest", status=400, body=b"plain text",
         headers={"Content-Encoding": "gzip"}, params={"ts": T}),
    Case("unknown content encoding", "POST", "/api/v1/ingest/dcgm", token="ingest", status=415, body=DCGM,
         headers={"Content-Encoding": "br"}, params={"ts": T}),
    Case("snappy preamble claims 4 GiB", "POST", "/api/v1/write", token="ingest", status=(400, 413), body=_snappy_liar(),
         headers={"Content-Encoding": "snappy", "Content-Type": "application/x-protobuf", "X-Prometheus-Remote-Write-Version": "0.1.0"}),
    Case("remote write body not snappy", "POST", "/api/v1/write", token="ingest", status=400, body=b"\xff" * 64,
         headers={"Content-Encoding": "snappy", "Content-Type": "application/x-protobuf", "X-Prometheus-Remote-Write-Version": "0.1.0"}),
    Case("remote write: snappy of protobuf garbage", "POST", "/api/v1/write", token="ingest", status=400,
         body=bytes(cramjam.snappy.compress_raw(_protobuf_garbage())),
         headers={"Content-Encoding": "snappy", "Content-Type": "application/x-protobuf", "X-Prometheus-Remote-Write-Version": "0.1.0"}),
    Case("OTLP protobuf garbage", "POST", "/v1/metrics", token="ingest", status=400, body=_protobuf_garbage(),
         headers={"Content-Type": "application/x-protobuf"}),
    Case("OTLP JSON deep", "POST", "/v1/metrics", token="ingest", status=400, body=_deep(), headers=J),
    Case("batches deep", "POST", "/api/v1/batches", token="ingest", status=400, body=_deep(), headers=J),
    Case("alert rule deep", "PUT", "/api/v1/alerts/rules/x", status=400, body=_deep(), headers=J),
    Case("lineage event deep", "POST", "/api/v1/lineage", token="governance", status=400, body=_deep(), headers=J),
    Case("JSON with a 1e999999 number", "POST", "/api/v1/batches", token="ingest", status=422, headers=J,
         body=b'{"frames": {"gpu_sample": [{"ts": "2026-03-01T12:00:00Z", "gpu_uuid": "G", "temp_c": 1e999999}]}}'),
    Case("JSON with NaN", "POST", "/api/v1/batches", token="ingest", status=(400, 422), headers=J,
         body=b'{"frames": {"gpu_sample": [{"ts": "2026-03-01T12:00:00Z", "gpu_uuid": "G", "temp_c": NaN}]}}'),
    Case("invalid UTF-8 in JSON", "POST", "/api/v1/batches", token="ingest", status=400, headers=J, body=b'{"frames": {"\xff\xfe": []}}'),
    Case("batch with an unknown frame", "POST", "/api/v1/batches", token="admin", status=(400, 422), headers=J, body=b'{"frames": {"passwd": [{"a": 1}]}}'),
    # --- cut, forged, hostile content ---------------------------------------------------------------
    Case("dcgm scrape cut mid-value", "POST", "/api/v1/ingest/dcgm", token="ingest", status=400, body=DCGM[:-3], params={"ts": T},
         contains="line feed"),
    Case("dcgm with NUL bytes", "POST", "/api/v1/ingest/dcgm", token="ingest", status=400, body=DCGM.replace(b"41", b"4\x001"), params={"ts": T}),
    Case("dcgm with a 200k-character label", "POST", "/api/v1/ingest/dcgm", token="ingest", status=400, params={"ts": T}, contains="over the limit",
         body=b'DCGM_FI_DEV_GPU_TEMP{UUID="' + b"G" * 200_000 + b'",Hostname="n1"} 41\n'),
    Case("dcgm with an unterminated label", "POST", "/api/v1/ingest/dcgm", token="ingest", status=400, params={"ts": T},
         body=b'DCGM_FI_DEV_GPU_TEMP{UUID="GPU-aaaa,Hostname="n1"} 41\n'),
    # not finite: dropped with a note (DCGM prints no infinities; a temperature of +Inf is no reading), nothing stored
    Case("dcgm value +Inf", "POST", "/api/v1/ingest/dcgm", token="ingest", status=200, params={"ts": T},
         body=DCGM.replace(b"} 41", b"} +Inf"), contains='"non_finite_dropped":1'),
    Case("billion laughs nvidia-smi XML", "POST", "/api/v1/ingest/nvidia_smi_xml", token="ingest", status=400, body=_billion_laughs(), params={"ts": T}),
    Case("UTF-16 XML with an entity", "POST", "/api/v1/ingest/nvidia_smi_xml", token="ingest", status=400, body=_utf16_entity(), params={"ts": T}),
    Case("XML external entity", "POST", "/api/v1/ingest/nvidia_smi_xml", token="ingest", status=400, params={"ts": T},
         body=b'<?xml version="1.0"?><!DOCTYPE x [<!ENTITY e SYSTEM "file:///etc/passwd">]><nvidia_smi_log>&e;</nvidia_smi_log>'),
    Case("job events with a cut last record", "POST", "/api/v1/ingest/job_events", token="ingest", status=400,
         body=b'{"job_id": "j", "ts": "2026-03-01T12:00:00Z", "kind": "started"}\n{"job_id": "j", "ts": "2026-03'),
    Case("unknown format", "POST", "/api/v1/ingest/passwd", token="ingest", status=(400, 404), body=DCGM),
    Case("format name with traversal", "POST", "/api/v1/ingest/..%2f..%2fetc%2fpasswd", token="ingest", status=(400, 404), body=DCGM),
    Case("a ts that is not a time", "POST", "/api/v1/ingest/dcgm", token="ingest", status=(400, 422), body=DCGM, params={"ts": "yesterday'; DROP TABLE gpu;--"}),
    Case("future-dated samples", "POST", "/api/v1/batches", token="ingest", status=422, headers=J, body=_future_batch),
    Case("future-dated scrape", "POST", "/api/v1/ingest/dcgm", token="ingest", status=422, body=DCGM,
         params={"ts": "2099-01-01T00:00:00Z"}),
    Case("SQL in a job id", "GET", "/api/v1/jobs/x' OR '1'='1/c3", token="read", status=404),
    Case("SQL in a frame name", "GET", "/api/v1/frames/gpu_sample;DROP TABLE gpu", token="read", status=(400, 404)),
    Case("fairness upload with a traversing model name", "POST", "/api/v1/models/..%2f..%2fetc/fairness", token="governance", status=(400, 404, 422),
         headers={"Content-Type": "text/csv"}, body=b"y_true,y_pred,sex\n1,1,F\n0,0,M\n"),
    Case("silence with a backreference regex", "POST", "/api/v1/alerts/silences", status=422, headers=J,
         body=b'{"matchers": [{"name": "a", "value": "(a)\\\\1", "isRegex": true}], "endsAt": "2099-01-01T00:00:00Z", "comment": "x"}'),
    Case("silence ending before it starts", "POST", "/api/v1/alerts/silences", status=(400, 422), headers=J,
         body=b'{"matchers": [{"name": "a", "value": "b", "isRegex": false}], "startsAt": "2099-01-02T00:00:00Z", "endsAt": "2099-01-01T00:00:00Z", "comment": "x"}'),
    *[Case(f"receiver to {url}", "PUT", "/api/v1/alerts/receivers/r", status=422, headers=J,
           body=json.dumps({"kind": "webhook", "url": url}).encode()) for url in [
        "http://169.254.169.254/latest/meta-data/", "http://[::ffff:127.0.0.1]:8000/", "http://0x7f000001/", "file:///etc/passwd",
        "http://[64:ff9b::a9fe:a9fe]/", "http://[2002:a9fe:a9fe::1]/", "http://198.18.0.1/", "gopher://127.0.0.1:6379/_FLUSHALL"]],
    Case("alert rule with an unknown field", "PUT", "/api/v1/alerts/rules/x", status=422, headers=J,
         body=b'{"alert": "x", "findings": {"kind": "a"}, "exec": "rm -rf /"}'),
    Case("declaration for a model that does not exist", "POST", "/api/v1/declarations", token="governance", status=(404, 422), headers=J,
         body=b'{"model": "nope", "version": "1", "kind": "intended_purpose", "value": {"text": "x"}}'),
    Case("lineage event that is not OpenLineage", "POST", "/api/v1/lineage", token="governance", status=(400, 422), headers=J,
         body=b'{"eventType": "DELETE", "run": {}, "job": {}}'),
    # --- heads ----------------------------------------------------------------------------------------
    Case("20 KB header", "GET", "/api/v1/counts", token="read", status=431, headers={"X-Flood": "a" * 20_000}),
    Case("150 headers", "GET", "/api/v1/counts", token="read", status=431, headers={f"X-F{i}": "1" for i in range(150)}),
]


def test_the_corpus_is_big_enough():
    assert len(CASES) >= 60, len(CASES)
    assert len({c.name for c in CASES}) == len(CASES), "case names must be unique"


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("corpus")
    url = f"sqlite:///{tmp / 'fs.db'}"
    db.upgrade(url)
    engine = db.make_engine(url)
    tokens = {s: auth.create_token(engine, f"corpus-{s}", [s]) for s in ("read", "ingest", "governance", "admin")}
    tokens["bound"] = auth.create_token(engine, "corpus-bound", ["ingest"], binding=auth.Binding(host="n7"))
    revoked = auth.create_token(engine, "corpus-revoked", ["admin"])
    auth.revoke_token(engine, next(t["token_id"] for t in auth.list_tokens(engine) if t["name"] == "corpus-revoked"))
    tokens["revoked"] = revoked
    tokens["expired"] = auth.create_token(engine, "corpus-expired", ["admin"], expires_at=dt.datetime.now(dt.UTC) - dt.timedelta(seconds=1))
    engine.dispose()
    port = free_port()
    env = {**os.environ, "FLEETSCOPE_DATA_DIR": str(tmp), "FLEETSCOPE_DATABASE_URL": url, "FLEETSCOPE_MAX_BODY_BYTES": str(2**20),
           "FLEETSCOPE_LOG_LEVEL": "WARNING", "FLEETSCOPE_AUTH_FAIL_BURST": "1000"}
    proc = subprocess.Popen([sys.executable, "-m", "fleetscope.cli", "serve", "--port", str(port)], env=env,
                            stdout=subprocess.DEVNULL, stderr=(tmp / "server.log").open("wb"))
    base = f"http://127.0.0.1:{port}"
    wait_healthy(base + "/healthz")
    # something to protect: a legitimate scrape, an admin's site and finding
    h = {"Authorization": f"Bearer {tokens['admin']}"}
    assert httpx.post(base + "/api/v1/ingest/dcgm", params={"ts": T}, content=DCGM, headers=h).status_code == 200
    seed = {"frames": {"site": [{"site_id": "dc1", "declared_pue": 1.3}],
                       "finding": [{"analyzer": "sdc", "kind": "sdc_suspect", "subject": "gpu:G", "window_start": T, "severity": "critical"}]}}
    assert httpx.post(base + "/api/v1/batches", json=seed, headers=h).status_code == 200
    store = Store.open(url)
    yield base, tokens, proc, store, tmp
    proc.terminate()
    proc.wait(timeout=30)
    store.engine.dispose()


def snapshot(store: Store) -> dict[str, list]:
    out = {}
    with store.engine.connect() as conn:
        for t in FROZEN:
            # a token's last use is bookkeeping, written by every check of it
            cols = "token_id, name, token_sha256, scopes, expires_at, revoked_at" if t == "api_token" else "*"
            out[t] = sorted(map(repr, conn.exec_driver_sql(f'SELECT {cols} FROM "{t}"').all()))
    return out


class PeakRSS:
    """The server's resident memory, sampled every few milliseconds while a request runs."""

    def __init__(self, pid: int) -> None:
        self.p = psutil.Process(pid)
        self.base = self.peak = self.p.memory_info().rss
        self.stop = threading.Event()

    def __enter__(self) -> PeakRSS:
        def run() -> None:
            while not self.stop.is_set():
                self.peak = max(self.peak, self.p.memory_info().rss)
                time.sleep(0.003)

        self.t = threading.Thread(target=run, daemon=True)
        self.t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.t.join()


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_hostile_request(server, case: Case):
    base, tokens, proc, store, tmp = server
    headers = dict(case.headers)
    if case.token is not None and "Authorization" not in headers:
        headers["Authorization"] = f"Bearer {tokens[case.token]}"
    body = case.body() if callable(case.body) else case.body
    before = snapshot(store)
    if headers.pop("Transfer-Encoding", None):
        content = (body[i:i + 65536] for i in range(0, len(body), 65536))  # a generator makes httpx send it chunked
    else:
        content = body
    with PeakRSS(proc.pid) as rss:
        t0 = time.monotonic()
        r = httpx.request(case.method, base + case.path, content=content or None, headers=headers, params=case.params, timeout=30)
        took = time.monotonic() - t0
    want = case.status if isinstance(case.status, tuple) else (case.status,)
    assert r.status_code in want, f"{case.name}: got {r.status_code} {r.text[:400]!r}, want {want}"
    assert r.status_code < 500
    assert case.contains in r.text, r.text[:400]
    assert took < MAX_S, f"{case.name} took {took:.2f} s"
    assert rss.peak - rss.base < MAX_RSS_GROWTH, f"{case.name}: server grew {(rss.peak - rss.base) / 2**20:.0f} MiB"
    assert snapshot(store) == before, f"{case.name} changed the store"
    assert proc.poll() is None, (tmp / "server.log").read_text()[-2000:]


def test_a_replayed_push_changes_nothing(server):
    base, tokens, _, store, _ = server
    before = snapshot(store)
    r = httpx.post(base + "/api/v1/ingest/dcgm", params={"ts": T}, content=DCGM, headers={"Authorization": f"Bearer {tokens['admin']}"})
    assert r.status_code == 200  # acknowledged: it is stored, once
    assert snapshot(store) == before

