"""The ingest door over HTTP: agents' concurrent pushes, overload, slow and malformed clients, and a
SIGKILL of the API in the middle of an agent-shaped load."""

from __future__ import annotations

import concurrent.futures as cf
import datetime as dt
import gzip
import importlib.util
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest
from sqlalchemy import text

from fleetscope.services import auth
from fleetscope.store import db, packed
from ingest import dcgm_lines

REPO = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("_bench_dcgm", REPO / "benchmarks" / "ingest_dcgm.py")
_bench = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_bench)
T0 = dt.datetime(2026, 6, 1, tzinfo=dt.UTC)


def _headers(engine, scope: str = "ingest") -> dict[str, str]:
    return {"Authorization": "Bearer " + auth.create_token(engine, "agents", [scope])}


def _body(h: int) -> bytes:
    return _bench.synth_scrape(8, first_gpu=8 * h, seed=h)


def test_agents_pushing_at_once_are_all_stored(api):
    h = _headers(api.app.state.store.engine)

    def push(k: int) -> dict:
        when = (T0 + dt.timedelta(seconds=10 * (k // 40))).isoformat()
        body = _body(k % 40)
        extra = {"Content-Encoding": "gzip"} if k % 2 else {}
        r = httpx.post(f"{api.url}/api/v1/ingest/dcgm", params={"ts": when, "source": f"node-{k % 40}"},
                       content=gzip.compress(body) if k % 2 else body, headers={**h, **extra}, timeout=60)
        assert r.status_code == 200, r.text
        return r.json()

    with cf.ThreadPoolExecutor(16) as pool:
        answers = list(pool.map(push, range(120)))
    assert all(a["written"]["gpu_sample"] == 8 and a["formats"] == ["dcgm"] for a in answers)
    with api.app.state.store.engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM gpu_sample")).scalar_one() == 120 * 8
        assert conn.execute(text("SELECT count(*) FROM ingest_log")).scalar_one() == 120


def test_a_full_door_answers_503_with_retry_after(api):
    h = _headers(api.app.state.store.engine)
    d = api.app.state.door
    before = d.max_pending
    d.max_pending = 0
    try:
        r = httpx.post(f"{api.url}/api/v1/ingest/dcgm", params={"ts": T0.isoformat()}, content=_body(1), headers=h)
        assert r.status_code == 503 and int(r.headers["Retry-After"]) >= 1
        assert "waiting" in r.json()["detail"]
        b = httpx.post(f"{api.url}/api/v1/batches", json={"frames": {"gpu": [{"gpu_uuid": "GPU-1"}]}}, headers=h)
        assert b.status_code == 503 and "Retry-After" in b.headers
        o = httpx.post(f"{api.url}/v1/metrics", content=b"", headers={**h, "Content-Type": "application/x-protobuf"})
        assert o.status_code == 503 and "Retry-After" in o.headers
    finally:
        d.max_pending = before
    assert api.app.state.store.counts()["gpu_sample"] == 0
    r = httpx.post(f"{api.url}/api/v1/ingest/dcgm", params={"ts": T0.isoformat()}, content=_body(1), headers=h)
    assert r.status_code == 200 and r.json()["written"]["gpu_sample"] == 8


def test_slow_and_malformed_clients_do_not_hold_up_the_others(api):
    h = _headers(api.app.state.store.engine)
    host, port = api.url.split("//")[1].split(":")
    slow = socket.create_connection((host, int(port)))
    try:
        # A client that promises 50 kB and sends it a few bytes at a time.
        slow.sendall(f"POST /api/v1/ingest/dcgm HTTP/1.1\r\nHost: x\r\nAuthorization: {h['Authorization']}\r\n"
                     "Content-Length: 50000\r\n\r\nDCGM_FI_DEV_GPU_TEMP{".encode())
        bad = httpx.post(f"{api.url}/api/v1/ingest/dcgm", params={"ts": T0.isoformat()}, content=b'DCGM_FI_DEV_GPU_TEMP{gpu="0"} 41\n', headers=h)
        assert bad.status_code == 400 and bad.json()["field"] == "UUID"
        cut = httpx.post(f"{api.url}/api/v1/ingest/dcgm", params={"ts": T0.isoformat()}, content=_body(2)[:-7], headers=h)
        # cut 7 bytes short, the last line has lost its newline: its value may be truncated, so all of it is refused
        assert (cut.status_code, cut.json()["field"]) == (400, "line") and "cut mid-line" in cut.json()["detail"]
        start = time.monotonic()
        ok = httpx.post(f"{api.url}/api/v1/ingest/dcgm", params={"ts": T0.isoformat()}, content=_body(3), headers=h, timeout=10)
        assert ok.status_code == 200 and ok.json()["written"]["gpu_sample"] == 8
        assert time.monotonic() - start < 5
    finally:
        slow.close()
    uuids = dcgm_lines.read(_body(3)).keys
    assert set(api.app.state.store.read("gpu_sample", gpu_uuid=uuids)["gpu_uuid"].to_list()) == set(uuids)
    assert api.app.state.store.read("gpu_sample", gpu_uuid=dcgm_lines.read(_body(2)).keys).height == 0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _serve(url: str, port: int, data_dir: Path) -> subprocess.Popen:
    env = {**os.environ, "FLEETSCOPE_DATABASE_URL": url, "FLEETSCOPE_DATA_DIR": str(data_dir), "FLEETSCOPE_LOG_LEVEL": "WARNING"}
    # a session of its own: the API is its processes (two on PostgreSQL by default), killed together as a
    # container's or a systemd unit's are
    proc = subprocess.Popen([sys.executable, "-m", "fleetscope.cli", "serve", "--port", str(port)], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1).status_code == 200:
                return proc
        except httpx.HTTPError:
            time.sleep(0.1)
    proc.kill()
    raise RuntimeError("fleetscope serve did not start")


@pytest.mark.slow
def test_sigkill_during_agent_load_loses_nothing_acknowledged(db_url, tmp_path):
    """16 agent threads push 3 scrapes of 24 nodes; the API is killed with SIGKILL mid-load and restarted.
    Every answered push has all its rows; no push has part of them; the agents' retries fill the gap."""
    engine = db.make_engine(db_url)
    h = _headers(engine)
    port = _free_port()
    base = f"http://127.0.0.1:{port}"
    server = _serve(db_url, port, tmp_path)
    nodes, rounds = 24, 3
    pushes = [(r, n) for r in range(rounds) for n in range(nodes)]
    acknowledged: list[tuple[int, int]] = []
    refused_or_lost = 0
    lock = threading.Lock()
    killed = threading.Event()

    def agent(items: list[tuple[int, int]]) -> None:
        nonlocal refused_or_lost
        with httpx.Client(timeout=30) as client:
            for r, n in items:
                when = (T0 + dt.timedelta(seconds=10 * r)).isoformat()
                deadline = time.monotonic() + 120
                while True:
                    try:
                        resp = client.post(f"{base}/api/v1/ingest/dcgm", params={"ts": when, "source": f"node-{n}"},
                                           content=_body(n), headers=h)
                        if resp.status_code == 200:
                            with lock:
                                acknowledged.append((r, n))
                            break
                        assert resp.status_code in (429, 503), resp.text
                    except httpx.HTTPError:
                        pass
                    with lock:
                        refused_or_lost += 1
                    assert time.monotonic() < deadline, "the API never came back"
                    time.sleep(0.2)

    per_agent = [pushes[k::16] for k in range(16)]
    with cf.ThreadPoolExecutor(16) as pool:
        futures = [pool.submit(agent, items) for items in per_agent]
        while len(acknowledged) < len(pushes) // 3:
            time.sleep(0.02)
        os.killpg(server.pid, signal.SIGKILL)
        server.wait(10)
        killed.set()
        at_kill = len(acknowledged)
        server = _serve(db_url, port, tmp_path)
        try:
            for f in futures:
                f.result(300)
        finally:
            server.terminate()
            server.wait(30)
    assert at_kill < len(pushes) and refused_or_lost > 0  # the kill interrupted the load
    assert sorted(acknowledged) == sorted(pushes)
    with engine.connect() as conn:
        samples = packed.source(engine.dialect.name, None, None, (), "s")  # the raw rows with their GPU's UUID
        rows = conn.execute(text(f"SELECT g.host, s.ts, count(*) FROM {samples} JOIN gpu g ON g.gpu_uuid = s.gpu_uuid GROUP BY g.host, s.ts")).all()
    # every (node, scrape) whole and exactly once: 8 GPUs, never part of them
    assert len(rows) == len(pushes) and {n for *_, n in rows} == {8}
    engine.dispose()


def test_a_gzip_scrape_sent_again_is_known_by_its_compressed_bytes(api):
    """The content hash of a body the API inflates is taken over the bytes as they arrived: the same gzip
    body again writes nothing, and the same text sent plain is a new input whose rows are all stored already."""
    import hashlib
    import json

    h = _headers(api.app.state.store.engine)
    text_body = _bench.synth_scrape(144)  # under the 1 MiB body limit
    gz = gzip.compress(text_body)
    assert len(gz) > 64 * 1024  # past the small-body lane: parsed in the thread pool, hashed beside the parse
    params = {"ts": T0.isoformat(), "source": "scraper"}

    def post(body: bytes, **headers: str) -> dict:
        r = httpx.post(f"{api.url}/api/v1/ingest/dcgm", params=params, content=body, headers={**h, **headers}, timeout=60)
        assert r.status_code == 200, r.text
        return r.json()

    first = post(gz, **{"Content-Encoding": "gzip"})
    again = post(gz, **{"Content-Encoding": "gzip"})
    plain = post(text_body)
    assert first["written"]["gpu_sample"] == 144 and first["skipped_duplicate"] is False
    assert again["skipped_duplicate"] is True and again["written"]["gpu_sample"] == 0
    assert plain["skipped_duplicate"] is False and plain["written"]["gpu_sample"] == 0 and plain["offered"]["gpu_sample"] == 144
    options = json.dumps(["dcgm", None, T0.isoformat(), None]).encode()
    with api.app.state.store.engine.connect() as conn:
        shas = conn.execute(text("SELECT content_sha256 FROM ingest_log ORDER BY at")).scalars().all()
        assert conn.execute(text("SELECT count(*) FROM gpu_sample")).scalar_one() == 144
    assert shas == [hashlib.sha256(gz + options).hexdigest(), hashlib.sha256(text_body + options).hexdigest()]


def test_the_agents_lane_and_the_route_judge_a_push_alike(api):
    """What a hostile or sloppy client sends is answered the same whether the agents' lane or FastAPI's route takes
    it (an extra query parameter sends it the route's way): times in forms other than RFC 3339, two
    Content-Encoding headers, a source holding control characters. Nothing is stored for a refusal."""
    h = _headers(api.app.state.store.engine)
    gz = gzip.compress(_body(50))

    def both(params: dict, body: bytes, headers: list[tuple[str, str]]) -> tuple[int, int]:
        codes = []
        for extra in ({}, {"route": "1"}):
            r = httpx.post(f"{api.url}/api/v1/ingest/dcgm", params={**params, **extra}, content=body,
                           headers=[*h.items(), *headers], timeout=60)
            codes.append(r.status_code)
        return codes[0], codes[1]

    def stored() -> int:
        with api.app.state.store.engine.connect() as conn:
            return conn.execute(text("SELECT count(*) FROM ingest_log")).scalar_one()

    for ts in ("20261206T190000Z", "2026-W49-7T19:00:00+00:00", "2026-12-06T19+00:00", "2026-12-06T19:00:00\x00+00:00",
               "2026-12-06T19:00:00", "2026-12-06t19:00:00z", "1765047600"):
        lane, route = both({"ts": ts}, _body(51), [])
        assert lane == route, ts
    assert stored() <= 2  # a form the route takes is stored once (the second send a duplicate)
    before = stored()
    lane, route = both({"ts": "2026-12-06T19:00:00.5+00:00"}, _body(52), [])
    assert (lane, route) == (200, 200) and stored() == before + 1
    before = stored()
    assert both({}, gz, [("Content-Encoding", "br"), ("Content-Encoding", "gzip")]) == (415, 415)
    for source in ("a\x00b", "node\x1b[2J", "tab\there"):
        assert both({"source": source}, _body(53), []) == (400, 400), repr(source)
    assert stored() == before


def test_input_being_parsed_is_bounded_and_past_the_bound_is_told_to_retry(db_url, tmp_path, monkeypatch):
    """A small gzip body can inflate to the body limit of blank lines, which a parse holds several times over: the
    input being parsed at once is bounded (``FLEETSCOPE_INGEST_MAX_PENDING_MB``), and past it a push gets 503
    with Retry-After at once rather than a place in a pile that can exhaust memory. One input larger than the
    bound is still read when it is alone."""
    from fleetscope.api import create_app
    from fleetscope.door import ingestion as ingestion_mod
    from tests.conftest import LiveServer, make_settings

    app = create_app(make_settings(tmp_path, db_url, max_body_bytes=4 * 2**20, ingest_max_pending_mb=1))
    entered, release = threading.Event(), threading.Event()
    original = ingestion_mod.to_push

    def held(data, **kw):  # type: ignore[no-untyped-def]
        if kw.get("source") == "first":
            entered.set()
            release.wait(30)
        return original(data, **kw)

    monkeypatch.setattr(ingestion_mod, "to_push", held)
    bomb = gzip.compress(b"\n" * (3 * 2**20))  # 3 MiB of blank lines in a few kB
    assert len(bomb) < 8192
    with LiveServer(app) as server:
        h = {**_headers(app.state.store.engine), "Content-Encoding": "gzip"}
        with cf.ThreadPoolExecutor(1) as pool:
            first = pool.submit(httpx.post, f"{server.url}/api/v1/ingest/dcgm", params={"source": "first"}, content=bomb, headers=h, timeout=60)
            assert entered.wait(30)
            second = httpx.post(f"{server.url}/api/v1/ingest/dcgm", params={"source": "second"}, content=bomb, headers=h, timeout=60)
            assert second.status_code == 503 and second.headers["Retry-After"] == "1", second.text
            # a node's small push is not parsed in this stage (the door's writer reads it): it is taken meanwhile
            small = httpx.post(f"{server.url}/api/v1/ingest/dcgm", params={"ts": T0.isoformat()}, content=_body(60),
                               headers=_headers(app.state.store.engine), timeout=60)
            assert small.status_code == 200, small.text
            release.set()
            done = first.result()
            assert done.status_code == 200 and not any(done.json()["written"].values())  # read: nothing in it
        again = httpx.post(f"{server.url}/api/v1/ingest/dcgm", params={"source": "second"}, content=bomb, headers=h, timeout=60)
        assert again.status_code == 200  # room again
    app.state.store.engine.dispose()


def test_a_small_body_that_inflates_past_a_nodes_push_is_inflated_off_the_event_loop(api, monkeypatch):
    """A few kB of gzip are inflated on the event loop only as far as a node's push can go (the agents' reader's
    limit): one that goes on (a bomb, a compressed file) is inflated again in a worker thread, within the body
    limit, so the loop every push waits on is not stopped for a large inflate."""
    from fleetscope.door import ingestion as ingestion_mod

    calls: list[tuple[int, str]] = []
    original = ingestion_mod.gunzip_capped

    def watched(data, limit, source):  # type: ignore[no-untyped-def]
        calls.append((limit, threading.current_thread().name))
        return original(data, limit, source)

    monkeypatch.setattr(ingestion_mod, "gunzip_capped", watched)
    h = {**_headers(api.app.state.store.engine), "Content-Encoding": "gzip"}
    blank = gzip.compress(b"\n" * (900 * 1024))  # past the reader's 512 KiB, within the fixture's 1 MiB body limit
    r = httpx.post(f"{api.url}/api/v1/ingest/dcgm", content=blank, headers=h, timeout=60)
    assert r.status_code == 200 and not any(r.json()["written"].values())
    assert [limit for limit, _ in calls] == [dcgm_lines.MAX_BYTES, 2**20]
    assert calls[0][1] != calls[1][1]  # the event loop's thread, then a worker's
    calls.clear()
    node = httpx.post(f"{api.url}/api/v1/ingest/dcgm", params={"ts": T0.isoformat()}, content=gzip.compress(_body(70)), headers=h, timeout=60)
    assert node.status_code == 200 and node.json()["written"]["gpu_sample"] == 8
    assert [limit for limit, _ in calls] == [dcgm_lines.MAX_BYTES]  # a node's push: inflated once, where it arrived
    over = httpx.post(f"{api.url}/api/v1/ingest/dcgm", content=gzip.compress(b"\n" * (2**20 + 1)), headers=h, timeout=60)
    assert over.status_code == 413
