"""The HTTP API against an attacker's requests, on a real uvicorn server over SQLite and PostgreSQL: each
answer is the refusal it should be, never a 5xx, and nothing stored changes."""

from __future__ import annotations

import contextlib
import datetime as dt
import gzip
import json
import secrets
import socket
import threading
import time
from pathlib import Path

import httpx
import pytest

from fleetscope.services import auth
from fleetscope.api import create_app
from fleetscope.api.server import CappedHttpTools, uvicorn_options
from tests.conftest import LiveServer, make_settings

T = "2026-03-01T12:00:00Z"
SDC = {"analyzer": "sdc", "kind": "sdc_suspect", "subject": "gpu:GPU-7", "window_start": T, "severity": "critical", "summary": "checksum mismatch"}


def bearer(secret: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {secret}"}


def make_token(api, *scopes: str, **binding: str) -> dict[str, str]:
    return bearer(auth.create_token(api.app.state.store.engine, "t", list(scopes), binding=auth.Binding(**binding) if binding else None))


def snapshot(api) -> dict[str, list]:
    """Every stored row of the frames an attacker aims at, to compare before and after."""
    store = api.app.state.store
    return {f: sorted(map(str, store.read(f).rows())) for f in ("gpu_sample", "gpu", "finding", "site", "host", "health_event", "job_analysis")}


@pytest.fixture
def big_api(db_url: str, tmp_path: Path):  # type: ignore[no-untyped-def]
    """A live API with the production body limit (256 MiB), so only the gate can stop a large body early."""
    app = create_app(make_settings(tmp_path, db_url))
    with LiveServer(app) as server:
        server.app = app
        yield server
    app.state.store.engine.dispose()


def _answer_while_sending(url: str, head: bytes, body: bytes) -> tuple[int, int]:
    """Send ``head`` then ``body`` in 64 KiB pieces from another thread while reading the answer here:
    (status, body bytes sent when the answer came)."""
    host, port = url.removeprefix("http://").split(":")
    sock = socket.create_connection((host, int(port)), timeout=30)
    sent = 0
    done = threading.Event()

    def feed() -> None:
        nonlocal sent
        try:
            sock.sendall(head)
            for i in range(0, len(body), 65536):
                if done.is_set():
                    return
                sock.sendall(body[i:i + 65536])
                sent += len(body[i:i + 65536])
        except OSError:
            pass  # the server closed the connection after answering: the rest was never wanted

    writer = threading.Thread(target=feed, daemon=True)
    writer.start()
    data = b""
    while b"\r\n" not in data:
        chunk = sock.recv(4096)
        if not chunk:
            break
        data += chunk
    at = sent
    done.set()
    sock.close()
    writer.join(timeout=30)
    return int(data.split(b" ")[1]), at


@pytest.mark.parametrize(("path", "method"), [("/api/v1/datasets", "PUT"), ("/api/v1/batches", "POST"), ("/api/v1/declarations", "POST"),
                                              ("/api/v1/alerts/rules/x", "PUT")])
def test_unauthenticated_16_mib_deep_body_is_401_before_it_is_read(big_api, path, method):
    body = b"[" * (8 * 2**20) + b"]" * (8 * 2**20)
    head = (f"{method} {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n").encode()
    status, sent = _answer_while_sending(big_api.url, head, body)
    assert status == 401
    assert sent < len(body)  # answered before the body was through: it was never read


def test_unauthenticated_15_mib_of_empty_arrays_is_401(big_api):
    body = b"[" + b"[]," * (5 * 2**20) + b"[]]"
    r = httpx.put(big_api.url + "/api/v1/datasets", content=body, headers={"Content-Type": "application/json"}, timeout=60)
    assert r.status_code == 401
    assert snapshot(big_api) == {k: [] for k in snapshot(big_api)}


@pytest.mark.parametrize(("path", "scope", "ctype"), [
    ("/api/v1/batches", "ingest", "application/json"),
    ("/api/v1/alerts/rules/r", "admin", "application/json"),
    ("/api/v1/alerts/silences", "admin", "application/json"),
    ("/api/v1/datasets", "governance", "application/json"),
    ("/api/v1/models/m/1", "governance", "application/json"),
    ("/api/v1/declarations", "governance", "application/json"),
    ("/api/v1/tokens", "admin", "application/json"),
    ("/api/v1/lineage", "governance", "application/json"),
    ("/v1/metrics", "ingest", "application/json"),
    ("/api/v1/ingest/otlp_json", "ingest", "application/json"),
    ("/api/v1/ingest/job_events", "ingest", "application/json"),
    ("/api/v1/ingest/nccl_inspector", "ingest", "application/json"),
    ("/api/v1/ingest/kineto", "ingest", "application/json"),
    ("/api/v1/ingest/auto", "ingest", "application/json"),
])
@pytest.mark.parametrize("shape", ["array", "object"])
def test_deep_json_is_a_clean_refusal_everywhere(api, path, scope, ctype, shape):
    n = 50_000
    deep = (b"[" * n + b"]" * n) if shape == "array" else (b'{"a":' * n + b"1" + b"}" * n)
    method = "PUT" if path.startswith(("/api/v1/alerts/rules", "/api/v1/datasets", "/api/v1/models")) else "POST"
    before = snapshot(api)
    r = httpx.request(method, api.url + path, content=deep, headers={**make_token(api, scope), "Content-Type": ctype}, timeout=60)
    assert 400 <= r.status_code < 500, (r.status_code, r.text[:300])
    assert snapshot(api) == before


def test_deep_otlp_json_inside_gzip_is_400(api):
    n = 50_000
    r = httpx.post(api.url + "/v1/metrics", content=gzip.compress(b"[" * n + b"]" * n),
                   headers={**make_token(api, "ingest"), "Content-Type": "application/json", "Content-Encoding": "gzip"})
    assert r.status_code == 400 and "FLEETSCOPE_MAX_JSON_DEPTH" in r.text


def test_a_leaked_ingest_token_cannot_downgrade_a_finding_or_a_sites_pue(api):
    admin = make_token(api, "admin")
    seeded = {"frames": {"site": [{"site_id": "dc1", "declared_pue": 1.3}], "finding": [SDC]}}
    assert httpx.post(api.url + "/api/v1/batches", json=seeded, headers=admin).status_code == 200
    before = snapshot(api)
    leaked = make_token(api, "ingest")
    for frames in ({"finding": [{**SDC, "severity": "info"}]}, {"site": [{"site_id": "dc1", "declared_pue": 1.0}]},
                   {"gpu_sample": [{"ts": T, "gpu_uuid": "GPU-7"}], "finding": [{**SDC, "severity": "info"}]}):
        r = httpx.post(api.url + "/api/v1/batches", json={"frames": frames}, headers=leaked)
        assert r.status_code == 403 and "needs the 'admin' scope" in r.json()["detail"]
    assert snapshot(api) == before
    assert api.app.state.store.read("finding")["severity"].to_list() == ["critical"]


def test_a_forged_binding_is_refused_on_every_way_in(api):
    from tests.fleetscope.test_api_limits import _dcgm

    h = make_token(api, "ingest", host="n7", site="dc1")
    before = snapshot(api)
    attempts = [
        httpx.post(api.url + "/api/v1/ingest/dcgm", params={"ts": T}, content=_dcgm("n8"), headers=h),
        httpx.post(api.url + "/api/v1/batches", json={"frames": {"gpu": [{"gpu_uuid": "GPU-9", "host": "n8"}]}}, headers=h),
        httpx.post(api.url + "/api/v1/batches", json={"frames": {"host": [{"host": "n7", "site_id": "dc2"}]}}, headers=h),
        httpx.post(api.url + "/api/v1/batches", json={"frames": {"health_event": [{"ts": T, "host": "n8", "gpu_uuid": "G", "kind": "xid", "code": 79}]}},
                   headers=h),
        httpx.post(api.url + "/api/v1/batches", json={"frames": {"nccl_test": [{"run_id": "r", "op": "all_reduce", "size_bytes": 8, "in_place": True,
                                                                              "hosts": "n7,n8"}]}}, headers=h),
    ]
    assert [r.status_code for r in attempts] == [403] * len(attempts), [r.text for r in attempts]
    assert all("nothing of the push was stored" in r.json()["detail"] for r in attempts)
    assert snapshot(api) == before


def test_a_forged_binding_over_otlp_is_403_permission_denied(api):
    doc = {"resourceMetrics": [{"resource": {"attributes": [{"key": "host.name", "value": {"stringValue": "n8"}}]}, "scopeMetrics": [{"metrics": [
        {"name": "DCGM_FI_DEV_GPU_TEMP", "gauge": {"dataPoints": [{"timeUnixNano": "1772366400000000000", "asDouble": 60.0,
                                                                    "attributes": [{"key": "UUID", "value": {"stringValue": "GPU-x"}}]}]}}]}]}]}
    r = httpx.post(api.url + "/v1/metrics", content=json.dumps(doc), headers={**make_token(api, "ingest", host="n7"), "Content-Type": "application/json"})
    assert r.status_code == 403 and r.json()["code"] == 7 and "bound to host 'n7'" in r.json()["message"]
    assert api.app.state.store.counts()["gpu_sample"] == 0
    ok = httpx.post(api.url + "/v1/metrics", content=json.dumps(doc), headers={**make_token(api, "ingest", host="n8"), "Content-Type": "application/json"})
    assert ok.status_code == 200 and api.app.state.store.counts()["gpu_sample"] == 1


def test_future_dated_samples_cannot_preempt_real_ones(api):
    h = make_token(api, "ingest")
    future = (dt.datetime.now(dt.UTC) + dt.timedelta(days=30)).replace(microsecond=0)
    forged = {"frames": {"gpu_sample": [{"ts": future.isoformat(), "gpu_uuid": "GPU-7", "power_w": 0.0, "temp_c": 20.0}]}}
    r = httpx.post(api.url + "/api/v1/batches", json=forged, headers=h)
    assert r.status_code == 422 and r.json()["frame"] == "gpu_sample" and future.isoformat().replace("+00:00", "Z") in r.json()["detail"]
    from tests.fleetscope.test_api_limits import _dcgm

    r = httpx.post(api.url + "/api/v1/ingest/dcgm", params={"ts": future.isoformat()}, content=_dcgm("n1", "GPU-7"), headers=h)
    assert r.status_code == 422
    assert api.app.state.store.counts()["gpu_sample"] == 0
    with api.app.state.store.engine.connect() as conn:
        assert conn.exec_driver_sql("SELECT count(*) FROM ingest_log").scalar() == 0


def test_a_token_flood_is_throttled_and_never_evicts_a_working_token(api):
    good = make_token(api, "read")
    assert httpx.get(api.url + "/api/v1/counts", headers=good).status_code == 200
    statuses = []
    with httpx.Client(base_url=api.url) as client:
        for _ in range(60):
            statuses.append(client.get("/api/v1/counts", headers=bearer("fs_" + secrets.token_urlsafe(32))).status_code)
    assert set(statuses) == {401, 429} and statuses.index(429) == 20  # FLEETSCOPE_AUTH_FAIL_BURST
    assert not any(s >= 500 for s in statuses)
    hit, found = auth.cached(good["Authorization"].removeprefix("Bearer "))
    assert hit and found is not None
    assert httpx.get(api.url + "/api/v1/counts", headers=good).status_code == 200
    assert auth._cache.sizes()[1] <= auth.CACHE_MAX_UNKNOWN


def test_a_header_flood_is_refused_by_the_gate(api):
    h = make_token(api, "read")
    big = httpx.get(api.url + "/api/v1/counts", headers={**h, "X-Flood": "a" * 20_000})
    assert big.status_code == 431 and "FLEETSCOPE_MAX_HEADER_BYTES" in big.json()["detail"]
    many = httpx.get(api.url + "/api/v1/counts", headers={**h, **{f"X-F{i}": "1" for i in range(150)}})
    assert many.status_code == 431 and "over the limit of 100" in many.json()["detail"]


@contextlib.contextmanager
def served(app, **options):  # type: ignore[no-untyped-def]
    """``app`` under uvicorn with `fleetscope serve`'s protocol options (and ``options`` over them), on a
    loopback port: yields the port."""
    import uvicorn

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="off", **{**uvicorn_options(8192), **options}))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        port = sock.getsockname()[1]
        for _ in range(200):
            try:
                httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1)
                break
            except httpx.HTTPError:
                threading.Event().wait(0.05)
        yield port
    finally:
        server.should_exit = True
        thread.join(timeout=10)
        sock.close()
        app.state.store.engine.dispose()


def test_a_header_flood_is_cut_off_while_the_server_reads_it(tmp_path):
    """`fleetscope serve`'s protocol answers 431 past the cap without buffering the rest of the head."""
    app = create_app(make_settings(tmp_path, f"sqlite:///{tmp_path / 'h.db'}", max_header_bytes=8192))
    with served(app) as port, socket.create_connection(("127.0.0.1", port), timeout=30) as conn:
        conn.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")
        try:
            for _ in range(1000):  # up to 64 MiB of headers, never finished
                conn.sendall(b"X-Flood: " + b"a" * 65536 + b"\r\n")
        except OSError:
            pass  # closed by the server once over the cap
        answer = conn.recv(4096)
    assert answer.startswith(b"HTTP/1.1 431") and b"FLEETSCOPE_MAX_HEADER_BYTES" in answer


class _Hurried(CappedHttpTools):
    read_header_s = 0.5
    read_body_s = 1.0


def _until_closed(conn: socket.socket) -> bytes:
    data = b""
    while chunk := conn.recv(65536):
        data += chunk
    return data


def test_stalled_heads_and_bodies_are_cut_off_and_nothing_of_them_is_stored(tmp_path, db_url):
    """Without the proxy, `fleetscope serve` itself bounds how long a client may take: an idle connection, a
    head or a body sent a byte at a time each hold a connection (a file descriptor and buffers) until cut."""
    app = create_app(make_settings(tmp_path, db_url))
    secret = auth.create_token(app.state.store.engine, "t", ["ingest"])
    body = b'DCGM_FI_DEV_POWER_USAGE{gpu="0",UUID="GPU-slow",Hostname="n1"} 100.0\n'
    head = (f"POST /api/v1/ingest/dcgm HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {secret}\r\n"
            f"Content-Length: {len(body)}\r\n\r\n").encode()
    with served(app, http=_Hurried) as port:
        def connect() -> socket.socket:
            return socket.create_connection(("127.0.0.1", port), timeout=10)

        with connect() as idle:
            assert _until_closed(idle) == b""  # never began a request: closed without an answer
        with connect() as slow_head:
            slow_head.sendall(head[:40])
            answer = _until_closed(slow_head)
        assert answer.startswith(b"HTTP/1.1 408") and answer.endswith(b"FLEETSCOPE_READ_HEADER_TIMEOUT_S")
        with connect() as slow_body:
            slow_body.sendall(head + body[:30])
            answer = _until_closed(slow_body)
        assert answer.startswith(b"HTTP/1.1 408") and b"FLEETSCOPE_READ_BODY_TIMEOUT_S; nothing of it was stored" in answer
        assert app.state.store.read("gpu_sample").height == 0
        with connect() as kept:
            # a kept-alive connection's clock starts at each request's first byte, not at the connection's
            kept.sendall(head + body)
            assert kept.recv(65536).startswith(b"HTTP/1.1 200")
            threading.Event().wait(0.8)
            kept.sendall(head[:40])
            threading.Event().wait(0.3)
            kept.sendall(head[40:] + body)
            assert kept.recv(65536).startswith(b"HTTP/1.1 200")
        assert app.state.store.read("gpu_sample").height == 1


class _HeldUp:
    """``app`` behind a server that holds requests up: one whose query is ``slow`` waits ``delay_s`` before its
    handler runs (a handler waiting on the database); with ``stream``, its response streams with that pause
    in its middle instead."""

    def __init__(self, app, delay_s: float = 2.0, stream: bool = False):  # type: ignore[no-untyped-def]
        self.app, self.state, self.delay_s, self.stream = app, app.state, delay_s, stream

    async def __call__(self, scope, receive, send):  # type: ignore[no-untyped-def]
        import asyncio

        if scope["type"] != "http" or scope.get("query_string") != b"slow":
            return await self.app(scope, receive, send)
        if self.stream:
            await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"10")]})
            await send({"type": "http.response.body", "body": b"01234", "more_body": True})
            await asyncio.sleep(self.delay_s)
            await send({"type": "http.response.body", "body": b"56789"})
            return None
        await asyncio.sleep(self.delay_s)
        return await self.app(scope, receive, send)


def _push(secret: str, body: bytes, query: str = "") -> bytes:
    return (f"POST /api/v1/ingest/dcgm{query} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {secret}\r\n"
            f"Content-Length: {len(body)}\r\n\r\n").encode() + body


def _dcgm_of(*uuids: str) -> bytes:
    return "".join(f'DCGM_FI_DEV_POWER_USAGE{{gpu="{i % 8}",UUID="{u}",Hostname="n1"}} 100.0\n' for i, u in enumerate(uuids)).encode()


def _answers(conn: socket.socket, n: int) -> tuple[list[bytes], bytes]:
    """The next ``n`` answers' status lines (Content-Length framed), fewer where the connection closed, and the
    bytes they came in."""
    conn.settimeout(10)
    data, seen, out = b"", b"", []
    while len(out) < n:
        head, sep, rest = data.partition(b"\r\n\r\n")
        if sep:
            length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n") if line.lower().startswith(b"content-length:")), 0)
            if len(rest) >= length:
                out.append(head.split(b"\r\n")[0])
                data = rest[length:]
                continue
        chunk = conn.recv(65536)
        if not chunk:
            break
        data += chunk
        seen += chunk
    return out, seen


def test_the_deadlines_count_only_the_clients_time(tmp_path):
    """Time the server holds a connection up is not the client's: a pipelined request waiting behind a slow
    one, a body the server pauses reading (past 64 KiB) until its handler reads, a response under way. Each
    is answered as it would be without deadlines, and no 408 lands inside another request's response."""
    app = create_app(make_settings(tmp_path, f"sqlite:///{tmp_path / 'h.db'}"))
    secret = auth.create_token(app.state.store.engine, "t", ["ingest"])
    with served(_HeldUp(app), http=_Hurried) as port:
        with socket.create_connection(("127.0.0.1", port), timeout=10) as conn:
            # behind a request whose handler takes 2 s, the next one's head, and its body 0.2 s later
            second = _push(secret, _dcgm_of("GPU-second"))
            conn.sendall(_push(secret, _dcgm_of("GPU-first"), "?slow") + second[:-20])
            threading.Event().wait(0.2)
            conn.sendall(second[-20:])
            assert [a[:12] for a in _answers(conn, 2)[0]] == [b"HTTP/1.1 200", b"HTTP/1.1 200"]
        with socket.create_connection(("127.0.0.1", port), timeout=10) as conn:
            large = _dcgm_of(*(f"GPU-bulk-{i}" for i in range(4000)))
            assert len(large) > 4 * 65536  # uvicorn stops reading past 64 KiB not yet taken by the handler
            conn.sendall(_push(secret, large, "?slow"))  # all at once; read 2 s later
            assert [a[:12] for a in _answers(conn, 1)[0]] == [b"HTTP/1.1 200"]
        stored = set(app.state.store.read("gpu_sample")["gpu_uuid"].to_list())
        assert {"GPU-first", "GPU-second", "GPU-bulk-3999"} <= stored
    app = create_app(make_settings(tmp_path, f"sqlite:///{tmp_path / 's.db'}"))
    secret = auth.create_token(app.state.store.engine, "t", ["ingest"])
    with served(_HeldUp(app, stream=True), http=_Hurried) as port, socket.create_connection(("127.0.0.1", port), timeout=10) as conn:
        late = _push(secret, _dcgm_of("GPU-late"))
        conn.sendall(b"GET /healthz?slow HTTP/1.1\r\nHost: x\r\n\r\n" + late[:-20])
        threading.Event().wait(0.2)
        conn.sendall(late[-20:])
        statuses, data = _answers(conn, 2)
    assert [a[:12] for a in statuses] == [b"HTTP/1.1 200", b"HTTP/1.1 200"] and b"\r\n\r\n0123456789HTTP/1.1 200" in data, data


def test_blank_lines_on_a_kept_alive_connection_do_not_hold_it(tmp_path):
    """Bytes cancel uvicorn's keep-alive timer, and blank lines between requests begin no request: the head's
    clock starts at the first byte, so a client sending one every few tenths of a second is still cut off."""
    app = create_app(make_settings(tmp_path, f"sqlite:///{tmp_path / 'h.db'}"))
    with served(app, http=_Hurried, timeout_keep_alive=1) as port, socket.create_connection(("127.0.0.1", port), timeout=10) as conn:
        conn.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        assert _answers(conn, 1)[0][0].startswith(b"HTTP/1.1 200")
        closed_after = None
        t0 = time.monotonic()
        while time.monotonic() - t0 < 5:
            try:
                conn.sendall(b"\r\n")
            except OSError:
                closed_after = time.monotonic() - t0
                break
            threading.Event().wait(0.2)
    # the head's 0.5 s, and a write or two more before the client learns of the close
    assert closed_after is not None and closed_after < 2.0, closed_after


def test_a_body_cut_off_leaves_no_traceback_in_the_log(tmp_path, capfd):
    """A client gone before its body's end (here cut off by the body deadline) is no error of the service: any
    client with a token could otherwise fill the log with tracebacks."""
    app = create_app(make_settings(tmp_path, f"sqlite:///{tmp_path / 'h.db'}"))
    secret = auth.create_token(app.state.store.engine, "t", ["ingest"])
    body = json.dumps({"frames": {"gpu_sample": [{"ts": "2026-03-01T12:00:00Z", "gpu_uuid": "G", "power_w": 1.0}]}}).encode()
    head = (f"POST /api/v1/batches HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {secret}\r\ncontent-type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n").encode()
    with served(app, http=_Hurried) as port, socket.create_connection(("127.0.0.1", port), timeout=10) as conn:
        conn.sendall(head + body[:20])
        assert _until_closed(conn).startswith(b"HTTP/1.1 408")
        threading.Event().wait(0.5)
    assert app.state.store.read("gpu_sample").height == 0
    err = capfd.readouterr().err
    assert "Traceback" not in err and "ClientDisconnect" not in err, err


def test_healthz_never_echoes_the_database_error(tmp_path):
    from fleetscope.store import db
    from fleetscope.store import Store

    url = "postgresql+psycopg://admin:hunter2@127.0.0.1:1/prod?connect_timeout=2"
    app = create_app(make_settings(tmp_path, f"sqlite:///{tmp_path / 'x.db'}"), store=Store(db.make_engine(url)))
    with LiveServer(app) as server:
        r = httpx.get(server.url + "/healthz", headers={"Authorization": "Bearer fs_guess"}, timeout=30)
    assert r.status_code == 503 and r.json() == {"status": "not ok"}
    assert "hunter2" not in r.text and "127.0.0.1" not in r.text
