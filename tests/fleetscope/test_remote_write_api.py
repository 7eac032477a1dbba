"""POST /api/v1/write (Prometheus remote write 1.0) on a live server, over SQLite and PostgreSQL: real values,
the spec's status codes, and hostile bodies that each get a clear 4xx and change nothing in the store."""

from __future__ import annotations

from pathlib import Path

import cramjam
import httpx
import pytest
from sqlalchemy.exc import OperationalError

from fleetscope.services import auth
from tests.ingest.rw_proto import text_series, write_request

TELEMETRY = Path(__file__).resolve().parents[2].parent / "shared" / "realdata" / "telemetry"
H100 = TELEMETRY / "dcgm-exporter_metrics_8xH100_k8s-pod-labels_sampled_nvidia-aicr.prom"
TS_MS = 1_773_144_000_250  # 2026-03-10T12:00:00.250Z
HEADERS = {"Content-Type": "application/x-protobuf", "Content-Encoding": "snappy", "X-Prometheus-Remote-Write-Version": "0.1.0"}
UUID = "GPU-1b2c"
BASE = {"UUID": UUID, "gpu": "0", "Hostname": "node-7", "modelName": "NVIDIA H100 80GB HBM3", "job": "dcgm", "instance": "node-7:9400"}


def snappy(data: bytes) -> bytes:
    return bytes(cramjam.snappy.compress_raw(data))


def auth_headers(api, *scopes: str) -> dict[str, str]:
    return {**HEADERS, "Authorization": "Bearer " + auth.create_token(api.app.state.store.engine, "prom", list(scopes or ["ingest"]))}


def small_request(temp: float = 45.0, xid: float = 0.0) -> bytes:
    return write_request([
        ({"__name__": "DCGM_FI_DEV_GPU_TEMP", **BASE}, [(temp, TS_MS)]),
        ({"__name__": "DCGM_FI_DEV_POWER_USAGE", **BASE}, [(312.25, TS_MS)]),
        ({"__name__": "DCGM_FI_DEV_XID_ERRORS", **BASE}, [(xid, TS_MS)]),
    ])


def post(api, body: bytes, headers: dict[str, str]) -> httpx.Response:
    return httpx.post(api.url + "/api/v1/write", content=body, headers=headers, timeout=30)


@pytest.mark.skipif(not TELEMETRY.is_dir(), reason=f"real telemetry fixtures not found at {TELEMETRY}")
def test_a_real_scrape_is_written_and_a_resent_body_writes_nothing_new(api):
    h = auth_headers(api, "ingest", "read")
    body = snappy(write_request(text_series(H100.read_text(), TS_MS, {"job": "dcgm", "instance": "gpu-node-1:9400"})))
    r = post(api, body, h)
    assert r.status_code == 204, r.text
    assert r.content == b""
    counts = api.app.state.store.counts()
    assert counts["gpu_sample"] == 8 and counts["gpu"] == 8 and counts["gpu_workload"] == 1
    rows = httpx.get(api.url + "/api/v1/frames/gpu_sample", params={"gpu_uuid": "GPU-c4529c8d-69c4-b61d-e0bc-7b2460096005"}, headers=h).json()
    assert [(row["temp_c"], row["power_w"], row["ts"]) for row in rows] == [(30, 113.611, "2026-03-10T12:00:00.250+00:00")]
    again = post(api, body, h)  # a sender's retry of the same body
    assert again.status_code == 204
    assert api.app.state.store.counts() == counts


def test_health_events_are_written(api):
    r = post(api, snappy(small_request(xid=79.0)), auth_headers(api))
    assert r.status_code == 204, r.text
    counts = api.app.state.store.counts()
    assert counts["gpu_sample"] == 1 and counts["health_event"] == 1


@pytest.mark.parametrize(
    ("change", "status"),
    [
        ({"Content-Type": "application/json"}, 415),
        ({"Content-Type": "application/x-protobuf;proto=io.prometheus.write.v2.Request"}, 415),
        ({"Content-Encoding": "gzip"}, 415),
        ({"Content-Encoding": ""}, 415),
        ({"Content-Type": "application/x-protobuf; proto=prometheus.WriteRequest"}, 204),
    ],
)
def test_content_type_and_encoding(api, change, status):
    r = post(api, snappy(small_request()), {**auth_headers(api), **change})
    assert r.status_code == status, r.text


def test_needs_an_ingest_token(api):
    assert post(api, snappy(small_request()), HEADERS).status_code == 401
    assert post(api, snappy(small_request()), auth_headers(api, "read")).status_code == 403
    assert api.app.state.store.counts()["gpu_sample"] == 0


def _hostile() -> list[tuple[str, bytes, int, str]]:
    good = small_request()
    cut = good[: len(good) - 7]
    ten_gb = b"\x80\xc8\xaf\xa0\x25"  # varint 10_000_000_000: more than snappy's 32 bits, and than the limit
    return [
        ("empty body", b"", 400, "empty body"),
        ("not snappy", b"\x0a\x05hello world", 400, "snappy"),
        ("snappy preamble claims 10 GB", ten_gb + b"\x00" * 16, 413, "decompress to 10000000000 bytes"),
        ("snappy preamble unterminated", b"\xff" * 12, 400, "snappy preamble"),
        ("preamble claims 4 GB", b"\xff\xff\xff\xff\x0f" + b"\x00" * 16, 413, "over the limit"),
        ("preamble claims more than the body limit", snappy(b"\x00" * (2**20 + 1))[:64], 413, "over the limit"),
        ("preamble lies", b"\x20" + snappy(good)[1:], 400, "snappy"),
        ("truncated request", snappy(cut), 400, "at byte"),
        ("label with invalid UTF-8", snappy(good.replace(b"node-7", b"node\xff7", 1)), 400, "not UTF-8 at byte"),
        ("huge varint", snappy(b"\x0a" + b"\xff" * 12), 400, "varint longer than 10 bytes"),
        ("negative length", snappy(b"\x0a\xff\xff\xff\xff\xff\xff\xff\xff\xff\x01"), 400, "claims"),
        ("deep groups", snappy(b"\x1b" * 5000 + b"\x1c" * 5000), 400, "nested deeper"),
        ("DCGM series without UUID", snappy(write_request([({"__name__": "DCGM_FI_DEV_GPU_TEMP", "gpu": "0"}, [(40.0, TS_MS)])])), 400, "no UUID"),
    ]


@pytest.mark.parametrize(("what", "body", "status", "says"), _hostile(), ids=[h[0] for h in _hostile()])
def test_hostile_bodies_get_a_clear_4xx_and_change_nothing(api, what, body, status, says):
    before = api.app.state.store.counts()
    r = post(api, body, auth_headers(api))
    assert r.status_code == status, r.text
    assert says in r.text
    assert api.app.state.store.counts() == before


def test_a_body_over_the_limit_is_refused_before_it_is_read(api):
    r = post(api, b"\x00" * (2**20 + 1), auth_headers(api))
    assert r.status_code == 413


def test_a_busy_database_is_retryable(api, monkeypatch):
    def locked(*_a, **_k):
        raise OperationalError("INSERT INTO gpu_sample", {}, Exception("database is locked"))

    monkeypatch.setattr(api.app.state.store, "write", locked)
    r = post(api, snappy(small_request()), auth_headers(api))
    assert r.status_code == 503 and r.headers["Retry-After"] == "2"
    monkeypatch.undo()
    assert post(api, snappy(small_request()), auth_headers(api)).status_code == 204
    assert api.app.state.store.counts()["gpu_sample"] == 1


def test_a_scrape_split_over_two_requests_keeps_both_halves(api):
    h = auth_headers(api)
    first = write_request([({"__name__": "DCGM_FI_DEV_GPU_TEMP", **BASE}, [(45.0, TS_MS)])])
    second = write_request([({"__name__": "DCGM_FI_DEV_POWER_USAGE", **BASE}, [(312.25, TS_MS)])])
    assert post(api, snappy(first), h).status_code == 204
    assert post(api, snappy(second), h).status_code == 204
    row = api.app.state.store.read("gpu_sample").row(0, named=True)
    assert (row["temp_c"], row["power_w"]) == (45, 312.25)


def test_senders_that_never_finish_their_bodies_do_not_lock_out_the_others(api, monkeypatch):
    """Remote write and OTLP take one of their bounded places only once a body has been read: more stalled senders
    than there are places (each sent its headers and a few bytes, then nothing) leave an honest sender answered."""
    import socket

    from fleetscope.api import routes_otlp, routes_remote_write
    from fleetscope.api.inflight import InFlight

    monkeypatch.setattr(routes_remote_write, "_in_flight", InFlight(2))
    monkeypatch.setattr(routes_otlp, "_in_flight", InFlight(2))
    h = auth_headers(api, "ingest")
    host, port = api.url.split("//")[1].split(":")
    stalled = []
    try:
        for path, ctype in [("/api/v1/write", "application/x-protobuf"), ("/v1/metrics", "application/x-protobuf")] * 4:
            s = socket.create_connection((host, int(port)))
            extra = "Content-Encoding: snappy\r\nX-Prometheus-Remote-Write-Version: 0.1.0\r\n" if path == "/api/v1/write" else ""
            s.sendall(f"POST {path} HTTP/1.1\r\nHost: x\r\nAuthorization: {h['Authorization']}\r\nContent-Type: {ctype}\r\n{extra}"
                      "Content-Length: 50000\r\n\r\n0123456789".encode())
            stalled.append(s)
        r = post(api, snappy(small_request()), h)
        assert r.status_code == 204, r.text
        otlp = httpx.post(f"{api.url}/v1/metrics", content=b"", headers={**h, "Content-Type": "application/x-protobuf"}, timeout=10)
        assert otlp.status_code == 200, otlp.text
    finally:
        for s in stalled:
            s.close()
