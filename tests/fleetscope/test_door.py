"""The ingest door: group commit on SQLite and PostgreSQL, each push answered for itself."""

from __future__ import annotations

import concurrent.futures as cf
import datetime as dt
import json
import importlib.util
import re
import threading
import time
from pathlib import Path

import polars as pl
import pytest
from sqlalchemy import text
from sqlalchemy.exc import OperationalError

from fleetscope import door
from fleetscope.door import ingestion, screen
from fleetscope.core import frames as F
from fleetscope.core.errors import ParseError, ValidationError
from fleetscope.store import Store
from ingest import dcgm_lines
from tests.conftest import wait_until

REPO = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("_bench_dcgm", REPO / "benchmarks" / "ingest_dcgm.py")
_bench = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_bench)
T0 = dt.datetime(2026, 6, 1, tzinfo=dt.UTC)


def _agent_push(h: int, when: dt.datetime = T0, **kw) -> screen.Push:
    body = _bench.synth_scrape(8, first_gpu=8 * h, seed=h, **kw)
    return ingestion.to_push(body, source=f"agent-{h}", fmt="dcgm", opts=ingestion.Options(ts=when))


def _count(store: Store, table: str) -> int:
    with store.engine.connect() as conn:
        return int(conn.execute(text(f"SELECT count(*) FROM {table}")).scalar_one())


def _counter_readings(store: Store) -> list[tuple]:
    with store.engine.connect() as conn:
        return sorted(conn.execute(text("SELECT gpu_uuid, code, value FROM counter_reading")).all())


def _gated(store: Store) -> tuple[door.Door, threading.Event]:
    """A door whose writer waits at its first group until the event is set: pushes pile up meanwhile."""
    gate, entered = threading.Event(), threading.Event()
    d = door.Door(store, window_s=0.0, writers=1)
    original = d._commit

    def commit(group):  # type: ignore[no-untyped-def]
        groups.append(len(group))
        entered.set()
        gate.wait(10)
        return original(group)

    groups: list[int] = []
    d.entered = entered  # type: ignore[attr-defined]  # set once the writer holds its first group
    d.groups = groups  # type: ignore[attr-defined]  # the size of each group the writer took

    d._commit = commit  # type: ignore[method-assign]
    return d, gate


def test_concurrent_pushes_commit_together_and_each_is_answered(store):
    d, gate = _gated(store)
    pushes = [_agent_push(h) for h in range(25)]
    first = d.submit(pushes[0])  # the writer takes it and waits at the gate
    # on a loaded machine the writer thread may start late and take more than the first push into its group
    assert d.entered.wait(10)
    futures = [d.submit(p) for p in pushes[1:]]
    gate.set()
    results = [f.result(30) for f in [first, *futures]]
    d.close()
    assert [r.result.written["gpu_sample"] for r in results] == [8] * 25
    assert [r.result.values for r in results] == [_bench.synth_scrape(8, first_gpu=8 * h, seed=h).count(b"\n") - 2 * 30
                                                  for h in range(25)]
    # What queued while the first group was held went in one transaction.
    assert results[0].group_size == 1 and results[-1].group_size == 24 and sum(1 / r.group_size for r in results) <= 2.01
    assert _count(store, "gpu_sample") == 25 * 8
    assert _count(store, "gpu") == 25 * 8
    # One ingest-log row per push, each with its own source and counts.
    log = store.query("SELECT source, rows_json FROM ingest_log ORDER BY source", (), {})
    assert log.height == 25
    logged = json.loads(log.filter(pl.col("source") == "agent-7")["rows_json"].item())
    assert logged == results[7].result.written == results[7].result.offered and logged["gpu_sample"] == 8


def test_a_bad_push_is_refused_alone(store):
    d, gate = _gated(store)
    first = d.submit(_agent_push(0))
    good = [d.submit(_agent_push(h)) for h in (1, 2, 3)]
    # A batch that parses but fails validation at the write (a NaN power reading).
    bad_batch = F.Batch(source="bad", gpu_sample=pl.DataFrame({"ts": [T0], "gpu_uuid": ["GPU-x"], "power_w": [float("nan")]}))
    bad = d.submit(screen.Push("bad", "f" * 64, ["batch"], batch=bad_batch))
    # A small dcgm body the line reader declines and the columnar parser refuses.
    cut = d.submit(ingestion.to_push(b'DCGM_FI_DEV_GPU_TEMP{gpu="0"} 41\n', source="cut", fmt="dcgm", opts=ingestion.Options(ts=T0)))
    more = [d.submit(_agent_push(h)) for h in (4, 5)]
    gate.set()
    assert first.result(30).result.written["gpu_sample"] == 8
    for f in good + more:
        assert f.result(30).result.written["gpu_sample"] == 8
    with pytest.raises(ValidationError) as bad_err:
        bad.result(30)
    assert bad_err.value.frame == "gpu_sample" and bad_err.value.field == "power_w"
    with pytest.raises(ParseError) as cut_err:
        cut.result(30)
    assert cut_err.value.field == "UUID"
    d.close()
    assert _count(store, "gpu_sample") == 6 * 8
    assert "GPU-x" not in store.read("gpu_sample")["gpu_uuid"].to_list()
    assert store.query("SELECT count(*) AS n FROM ingest_log WHERE source IN ('bad', 'cut')", (), {})["n"].item() == 0


def test_resent_pushes_write_nothing_new(store):
    d = door.Door(store)
    one = d.accept(_agent_push(3), timeout_s=30)
    assert not one.skipped_duplicate and one.result.written["gpu_sample"] == 8
    again = d.accept(_agent_push(3), timeout_s=30)
    assert again.skipped_duplicate and again.result.offered == one.result.offered
    assert set(again.result.written.values()) == {0}
    # Twice in one group: the second is the duplicate of the first.
    d2, gate = _gated(store)
    a = d2.submit(_agent_push(4))
    b, c = d2.submit(_agent_push(5)), d2.submit(_agent_push(5))
    gate.set()
    assert a.result(30).result.written["gpu_sample"] == 8
    assert b.result(30).result.written["gpu_sample"] == 8 and c.result(30).skipped_duplicate
    # The same node a scrape later is new data.
    later = d.accept(_agent_push(3, T0 + dt.timedelta(seconds=10)), timeout_s=30)
    assert later.result.written["gpu_sample"] == 8
    d.close()
    d2.close()
    assert _count(store, "gpu_sample") == 4 * 8
    assert _count(store, "ingest_log") == 4


def test_acknowledged_means_readable_by_another_connection(store):
    d = door.Door(store)
    futures = [d.submit(_agent_push(h)) for h in range(6)]
    other = Store.open(str(store.engine.url.render_as_string(hide_password=False)))
    try:
        for h, f in enumerate(futures):
            f.result(30)
            uuids = set(_bench_uuids(h))
            got = set(other.read("gpu_sample", gpu_uuid=list(uuids))["gpu_uuid"].to_list())
            assert got == uuids
    finally:
        other.engine.dispose()
        d.close()


def _bench_uuids(h: int) -> list[str]:
    from ingest import dcgm_lines

    return dcgm_lines.read(_bench.synth_scrape(8, first_gpu=8 * h, seed=h)).keys


def test_a_full_door_refuses_at_once(store):
    d, gate = _gated(store)
    d.max_pending = 3
    held = [d.submit(_agent_push(h)) for h in range(3)]
    with pytest.raises(door.Overloaded) as exc:
        d.submit(_agent_push(9))
    assert exc.value.retry_after_s >= 1 and "waiting" in str(exc.value)
    gate.set()
    for f in held:
        f.result(30)
    assert d.accept(_agent_push(9), timeout_s=30).result.written["gpu_sample"] == 8  # room again
    d.close()


def test_a_database_error_fails_the_group_and_stores_nothing(store, monkeypatch):
    d, gate = _gated(store)
    futures = [d.submit(_agent_push(h)) for h in range(4)]

    def down(*a, **k):  # type: ignore[no-untyped-def]
        raise OperationalError("INSERT", {}, Exception("database is locked"))

    monkeypatch.setattr(store, "write", down)
    monkeypatch.setattr(store, "write_rows", down)
    gate.set()
    for f in futures:
        with pytest.raises(OperationalError):
            f.result(30)
    monkeypatch.undo()
    d.close()
    assert _count(store, "gpu_sample") == 0


@pytest.mark.parametrize("driver", ["sqlite3", "psycopg"])
def test_a_drivers_busy_error_is_the_retryable_error_and_is_not_written_push_by_push(store, monkeypatch, driver):
    """Rows go by the drivers' own cursors, whose errors come unwrapped ("database is locked" after SQLite's busy
    timeout, a lost PostgreSQL connection): the store gives them as SQLAlchemy's, so the group's pushes all get the
    retryable error at once (the routes' 503 with Retry-After), not a 500, and are not written again one by one,
    each waiting out the timeout."""
    import importlib

    error = importlib.import_module(driver).OperationalError("database is locked")
    d, gate = _gated(store)
    futures = [d.submit(_agent_push(h)) for h in range(4)]
    calls = []

    def down(*a, **k):  # type: ignore[no-untyped-def]
        calls.append(1)
        raise error

    monkeypatch.setattr(store, "_log_ingest", down)  # inside the write's transaction, on either path
    gate.set()
    for f in futures:
        with pytest.raises(OperationalError) as exc:
            f.result(30)
        assert exc.value.orig is error
    # one write a group, never one a push: a loaded machine's writer may take the first push alone before the rest
    # are submitted, and then the other three still fail together
    assert len(calls) == len(d.groups) and max(d.groups) >= 3, (calls, d.groups)
    monkeypatch.undo()
    d.close()
    assert _count(store, "gpu_sample") == 0


@pytest.mark.parametrize("failure", ["busy", "bad"])
def test_a_copy_in_the_group_shares_its_first_copys_failure(store, monkeypatch, failure):
    """Two copies of one push in a group: where the first's write fails, the second is told the same error, never
    "skipped as a duplicate" (an acknowledgement means stored), and a later send stores it."""
    d, gate = _gated(store)
    first, copy = d.submit(_agent_push(6)), d.submit(_agent_push(6))
    error = OperationalError("INSERT", {}, Exception("database is locked")) if failure == "busy" else RuntimeError("disk on fire")

    def down(*a, **k):  # type: ignore[no-untyped-def]
        raise error

    monkeypatch.setattr(store, "write", down)
    monkeypatch.setattr(store, "write_rows", down)
    gate.set()
    for f in (first, copy):
        with pytest.raises(type(error)):
            f.result(30)
    monkeypatch.undo()
    assert _count(store, "gpu_sample") == 0
    again = d.accept(_agent_push(6), timeout_s=30)
    assert not again.skipped_duplicate and again.result.written["gpu_sample"] == 8
    d.close()


def test_health_events_wake_alerting_once_per_group(store):
    woken: list[int] = []
    d = door.Door(store, after_commit=lambda health, jobs: woken.append(health.height))
    gate = threading.Event()
    original = d._commit
    d._commit = lambda group: (gate.wait(10), original(group))[1]  # type: ignore[method-assign]
    futures = [d.submit(_agent_push(h, xids={8 * h: 79})) for h in range(5)]
    gate.set()
    for f in futures:
        assert f.result(30).result.written.get("health_event") == 1
    d.close()
    assert sum(woken) == 5 and len(woken) <= 2


def test_many_threads_many_pushes(store):
    """Sixteen agents' worth of threads: every push stored exactly once, whatever the grouping."""
    d = door.Door(store, window_s=0.002)
    with cf.ThreadPoolExecutor(16) as pool:
        results = list(pool.map(lambda h: d.accept(_agent_push(h % 32, T0 + dt.timedelta(seconds=10 * (h // 32))), timeout_s=60), range(96)))
    d.close()
    assert all(r.result.written["gpu_sample"] == 8 for r in results)
    assert _count(store, "gpu_sample") == 96 * 8
    assert _count(store, "ingest_log") == 96


def _with_faults(body: bytes, h: int) -> bytes:
    """An agent body whose node has faults: an uncorrectable-remap count on one GPU, and on another an XID
    with dcgm-exporter's text of it in the GPU's labels."""
    body = re.sub(rb"(DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS\{[^}]*\}) 0\n", rb"\1 3\n", body, count=1)
    uuid = re.findall(rb'UUID="([^"]+)"', body)[8 - 1 - h % 8]
    out = []
    for line in body.splitlines(keepends=True):
        if b'UUID="' + uuid + b'"' in line:
            line = line.replace(b'DCGM_FI_DRIVER_VERSION="580.105.08"', b'DCGM_FI_DRIVER_VERSION="580.105.08",err_msg="Graphics Engine Exception"')
            if line.startswith(b"DCGM_FI_DEV_XID_ERRORS"):
                line = line.rsplit(b" ", 1)[0] + b" 13\n"
        out.append(line)
    return b"".join(out)


@pytest.mark.parametrize("faults", [False, True], ids=["plain", "faults"])
@pytest.mark.parametrize("seen_before", [None, False, True], ids=["line-read", "first-sight", "from-templates"])
def test_the_rows_path_stores_what_the_frame_path_stores(db_url, tmp_path, seen_before, faults):
    """A group of agent bodies goes to the store as tuples (Store.write_rows); the same pushes written
    as frames (Store.write) leave the same rows. Pods, unmapped DCGM fields and a node sent twice included;
    as read line by line (the general row path), as read on first sight (line by line, then given as the
    template just learned gives them) and filled from their templates (the steady state). With faults, the
    health events too: an XID with its text, a remap count (repeated by the node sent twice: one event), and
    the counters' readings the store keeps."""
    from fleetscope.store import db as dbm

    other_url = f"sqlite:///{tmp_path / 'frames.db'}"
    dbm.upgrade(other_url)
    rows_store, frames_store = Store.open(db_url), Store.open(other_url)

    def pushes() -> list[screen.Push]:
        out = []
        for h in range(6):
            body = _bench.synth_scrape(8, first_gpu=8 * h, seed=h, busy_fraction=0.6)
            if faults and h % 2 == 0:
                body = _with_faults(body, h)
            body += f'DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL{{gpu="0",UUID="GPU-extra-{h}",Hostname="n{h}"}} {h}\n'.encode()
            out.append(ingestion.to_push(body, source=f"agent-{h}", fmt="dcgm", opts=ingestion.Options(ts=T0)))
        again = _bench.synth_scrape(8, seed=0, busy_fraction=0.6)
        out.append(ingestion.to_push(_with_faults(again, 0) if faults else again, source="again", fmt="dcgm",
                                     opts=ingestion.Options(ts=T0 + dt.timedelta(seconds=10))))
        for p in out:
            screen.prepare(p)
        return out

    dcgm_lines.forget()
    if seen_before:
        pushes()
    group = pushes()
    assert all(p.lines.flat is not None for p in group)
    if seen_before is None:
        for p in group:
            p.lines = dcgm_lines._read_lines(p.dcgm, [], [])
            assert p.lines.flat is None
    assert door._as_rows(group) is not None
    d = door.Door(rows_store)
    futures = [cf.Future() for _ in group]
    d._write(list(zip(group, futures)))
    batch, offered, values = door._assemble(pushes(), "frames")
    frames_store.write(batch)
    try:
        for frame in ("gpu", "gpu_sample", "gpu_workload", "metric_sample", "health_event"):
            a, b = rows_store.read(frame), frames_store.read(frame)
            assert (a.height > 0) == (faults or frame != "health_event"), frame
            assert a.sort(a.columns).equals(b.sort(b.columns)), frame
        readings = _counter_readings(rows_store)
        assert readings == _counter_readings(frames_store) and (len(readings) > 0) == faults
        if faults:
            events = rows_store.read("health_event").sort("ts", "gpu_uuid", "code")
            assert events.filter(pl.col("kind") == "xid")["message"].to_list() == ["XID 13: Graphics Engine Exception"] * 4
            assert events.filter(pl.col("kind") == "row_remap").select("code", "value", "message").rows() == [
                (393, 3.0, "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS=3")] * 3  # host 0's second scrape repeats its count
            assert [f.result(0).result.offered.get("health_event", 0) for f in futures] == [2, 0, 2, 0, 2, 0, 2]
            assert sum(f.result(0).result.written.get("health_event", 0) for f in futures) == 7
    finally:
        d.close()
        rows_store.engine.dispose()
        frames_store.engine.dispose()


def test_otlp_pushes_are_built_together_and_a_repeated_gpu_stays_apart(store):
    """A group of OTLP requests is built into frames once; a request about a GPU already in the group (the
    same node a scrape later) is built alone; each is answered for itself and every row is stored."""
    from ingest import otlp

    spec = importlib.util.spec_from_file_location("_bench_otlp", REPO / "benchmarks" / "ingest_otlp.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    t_ns = 1_800_000_000 * 10**9
    bodies = [bench.build_request(8, t_ns, first=8 * h) for h in range(5)] + [bench.build_request(8, t_ns + 10**10, first=0)]
    d, gate = _gated(store)
    first = d.submit(_agent_push(40))
    futures = [d.submit(screen.Push(f"otlp-{i}", f"{i:064x}", ["otlp"], otlp=otlp.read(b, encoding="protobuf"))) for i, b in enumerate(bodies)]
    gate.set()
    first.result(30)
    answers = [f.result(30) for f in futures]
    d.close()
    assert [a.result.written["gpu_sample"] for a in answers] == [8] * 6
    assert answers[0].result.offered.get("health_event") == answers[0].result.written.get("health_event") > 0  # GPU 0 faults
    assert _count(store, "gpu_sample") == 8 * 7
    gpu0 = store.read("gpu_sample", gpu_uuid=otlp.gpu_uuids(otlp.read(bodies[0], encoding="protobuf"))[:1])
    assert gpu0.height == 2


def _otlp_bench():  # type: ignore[no-untyped-def]
    spec = importlib.util.spec_from_file_location("_bench_otlp", REPO / "benchmarks" / "ingest_otlp.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    return bench


def _otlp_pushes(t_ns: int, hosts: range, *, pods: bool = True, faulty: int | None = None, nul: int | None = None) -> list[screen.Push]:
    """Agent-shaped OTLP requests (8 GPUs, 30 DCGM fields), one with pods and a plain series; ``faulty``:
    that host's GPUs report XID 79."""
    from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest
    from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue

    from ingest import otlp

    bench = _otlp_bench()
    out = []
    for h in hosts:
        req = ExportMetricsServiceRequest.FromString(bench.build_request(8, t_ns, first=8 * h + 1))  # from GPU 1: no fault by default
        for m in req.resource_metrics[0].scope_metrics[0].metrics:
            for p in m.gauge.data_points:
                if m.name == "DCGM_FI_DEV_XID_ERRORS":
                    p.as_double = 79.0 if h == faulty else 0.0
                if m.name == "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL":
                    p.as_double = 2.0 if h == faulty else 0.0
                if pods and h % 2:
                    p.attributes.extend([KeyValue(key="pod", value=AnyValue(string_value=f"train-{h}")),
                                         KeyValue(key="namespace", value=AnyValue(string_value="ml"))])
        m = req.resource_metrics[0].scope_metrics[0].metrics.add()
        m.name = "node.fan.speed"
        dp = m.gauge.data_points.add()
        dp.time_unix_nano, dp.as_double = t_ns, 1200.0 + h
        dp.attributes.append(KeyValue(key="host.name", value=AnyValue(string_value=f"gpu-node-{h}" + ("\x00" if h == nul else ""))))
        body = req.SerializeToString()
        out.append(screen.Push(f"otlp-{h}", f"{h:032x}{t_ns:032x}", ["otlp"], otlp=otlp.read(body, encoding="protobuf")))
    return out


@pytest.mark.parametrize("seen_before", [False, True], ids=["first-sight", "from-templates"])
def test_the_otlp_rows_path_stores_what_the_frame_path_stores(db_url, tmp_path, seen_before):
    """A group of plain OTLP requests goes to the store as tuples (Store.write_rows); the same requests
    built into frames (gather, Store.write) leave the same rows: pods, a plain series, integer columns."""
    from fleetscope.store import db as dbm
    from ingest import otlp, otlp_template

    other_url = f"sqlite:///{tmp_path / 'frames.db'}"
    dbm.upgrade(other_url)
    rows_store, frames_store = Store.open(db_url), Store.open(other_url)
    otlp_template.clear()
    t_ns = 1_800_000_000 * 10**9
    if seen_before:
        _otlp_pushes(t_ns - 10**10, range(6))
    hits = otlp_template._stats["hits"]
    group = _otlp_pushes(t_ns, range(6), faulty=3)
    assert otlp_template._stats["hits"] - hits == (6 if seen_before else 0)
    assert door._as_rows(group) is not None and all(otlp.plain(p.otlp) for p in group)
    d = door.Door(rows_store)
    futures = [cf.Future() for _ in group]
    d._write(list(zip(group, futures)))
    frames_store.write(otlp.gather([p.otlp for p in _otlp_pushes(t_ns, range(6), faulty=3)]))
    try:
        assert [f.result(0).result.written["gpu_sample"] for f in futures] == [8] * 6
        assert [f.result(0).result.written.get("health_event", 0) for f in futures] == [0, 0, 0, 16, 0, 0]
        for frame in ("gpu", "gpu_sample", "gpu_workload", "metric_sample", "health_event"):
            a, b = rows_store.read(frame), frames_store.read(frame)
            assert a.height > 0, frame
            assert a.sort(a.columns).equals(b.sort(b.columns)), frame
        assert sorted(set(rows_store.read("health_event")["message"])) == ["DCGM_FI_DEV_ECC_DBE_VOL_TOTAL=2", "XID 79"]
        readings = _counter_readings(rows_store)
        assert readings == _counter_readings(frames_store) and [r[1:] for r in readings] == [(311, 2.0)] * 8  # the faulty node's counts: zeros of unknown counters are not kept
        assert rows_store.read("gpu_workload").height == 3 * 8
    finally:
        d.close()
        rows_store.engine.dispose()
        frames_store.engine.dispose()


def test_a_faulty_push_is_written_with_its_plain_group(store):
    """One node's XID in a group of plain OTLP pushes: the group goes as rows in one write, the XID's health
    events with it (alerting woken with them), each push answered for itself; a re-send writes nothing."""
    woken: list[pl.DataFrame] = []
    d = door.Door(store, after_commit=lambda health, jobs: woken.append(health))
    gate = threading.Event()
    original = d._commit
    d._commit = lambda group: (gate.wait(10), original(group))[1]  # type: ignore[method-assign]
    t_ns = 1_800_000_000 * 10**9
    group = _otlp_pushes(t_ns, range(5), faulty=2)
    assert [door._kind(p) for p in group] == ["otlp"] * 5 and door._as_rows(group) is not None
    futures = [d.submit(p) for p in group]
    gate.set()
    answers = [f.result(30) for f in futures]
    again = d.accept(_otlp_pushes(t_ns, range(5), faulty=2)[2], timeout_s=30)
    d.close()
    assert [a.result.written["gpu_sample"] for a in answers] == [8] * 5
    assert [a.result.written.get("health_event", 0) for a in answers] == [0, 0, 16, 0, 0]  # an XID and an ECC count a GPU
    assert [a.group_size for a in answers] == [5] * 5
    (health,) = woken
    stored = store.read("health_event")
    assert health.columns == list(F.HEALTH_EVENT.names) and health.sort(health.columns).equals(stored.sort(stored.columns))
    assert sorted(stored["message"].unique()) == ["DCGM_FI_DEV_ECC_DBE_VOL_TOTAL=2", "XID 79"]
    hosts = dict(store.read("gpu").select("gpu_uuid", "host").rows())
    assert all(hosts[g] == h for g, h in stored.select("gpu_uuid", "host").rows()) and stored["host"].n_unique() == 2
    assert again.skipped_duplicate
    assert _count(store, "gpu_sample") == 40 and _count(store, "health_event") == 16 and _count(store, "ingest_log") == 5
    assert _count(store, "metric_sample") == 5


def test_kinds_naming_one_gpu_stay_one_write():
    """A plain push and one the frame path takes (a NUL in a text: refused there, saying where) about one GPU are not split:
    arrival order decides which copy is kept. About different GPUs, each kind is a write of its own."""
    t_ns = 1_800_000_000 * 10**9
    a = _otlp_pushes(t_ns, range(1))[0]
    b = _otlp_pushes(t_ns, range(1), nul=0)[0]
    assert [door._kind(p) for p in (a, b)] == ["otlp", "frames"]
    items = [(a, None), (b, None)]
    assert door._split(items) == [items]
    c = _otlp_pushes(t_ns, range(1, 2), nul=1)[0]
    assert door._split([(a, None), (c, None)]) == [[(a, None)], [(c, None)]]


def test_one_push_given_to_two_processes_at_once_is_stored_once(db_url):
    """Two API processes (two stores, two doors) given the same push while the first one's write is still
    open: the second checks the ingest log only once the first has committed, finds it, and writes nothing."""
    first, second = Store.open(db_url), Store.open(db_url)
    held, release = threading.Event(), threading.Event()
    log_ingest = first._log_ingest

    def hold(conn, entries):  # type: ignore[no-untyped-def]
        log_ingest(conn, entries)
        held.set()  # the rows and the log row are written, not committed
        release.wait(30)

    first._log_ingest = hold  # type: ignore[method-assign]
    door_1, door_2 = door.Door(first, window_s=0.0), door.Door(second, window_s=0.0)
    try:
        got_1 = door_1.submit(_agent_push(3))
        assert held.wait(30)
        got_2 = door_2.submit(_agent_push(3))
        if db_url.startswith("postgresql"):
            # the second writer waits on the first's lock of that content, not on its rows
            wait_until(lambda: _count(first, "pg_locks WHERE locktype = 'advisory' AND NOT granted"
                                         " AND database = (SELECT oid FROM pg_database WHERE datname = current_database())") == 1, 30,
                       "the second writer to wait for the first")
        release.set()
        one, two = got_1.result(30), got_2.result(30)
    finally:
        release.set()
        door_1.close()
        door_2.close()
    assert not one.skipped_duplicate and one.result.written["gpu_sample"] == 8
    assert two.skipped_duplicate and two.result.written["gpu_sample"] == 0 and two.result.offered == one.result.offered
    assert _count(first, "ingest_log") == 1
    assert _count(first, "gpu_sample") == 8
    first.engine.dispose()
    second.engine.dispose()


def test_a_group_holding_a_push_another_process_stored_writes_the_rest(store):
    """The ingest log is checked in the group's transaction: a push stored meanwhile by another process is
    answered as a duplicate, and the rest of its group is written without it."""
    other = Store.open(str(store.engine.url.render_as_string(hide_password=False)))
    door.Door(other, window_s=0.0).accept(_agent_push(1))
    d, gate = _gated(store)
    futures = [d.submit(_agent_push(h)) for h in range(4)]
    gate.set()
    results = [f.result(30) for f in futures]
    d.close()
    assert [r.skipped_duplicate for r in results] == [False, True, False, False]
    assert [r.result.written["gpu_sample"] for r in results] == [8, 0, 8, 8]
    assert _count(store, "gpu_sample") == 4 * 8
    assert _count(store, "ingest_log") == 4
    other.engine.dispose()


def test_with_two_writers_a_new_node_goes_beside_a_write_and_a_known_one_waits_for_it(store):
    """Two writers: a push about GPUs the door has written waits for the writer in the database to finish (groups
    stay whole where writes are quick); a node's first push, the slow write of new inventory and series, goes
    beside it at once. The pushes are read where they arrive, as the agents' lane reads them."""

    def _lane_push(h: int, when: dt.datetime = T0) -> screen.Push:
        push = _agent_push(h, when)
        screen.read_lines(push)
        assert push.lines is not None
        return push

    d = door.Door(store, window_s=0.0, writers=2)
    d.accept(_lane_push(0), 60)
    gate, inside = threading.Event(), []
    original = d._commit

    def commit(group):  # type: ignore[no-untyped-def]
        inside.append([p.source for p, _ in group])
        if len(inside) == 1:
            gate.wait(60)
        return original(group)

    d._commit = commit  # type: ignore[method-assign]
    first = d.submit(_lane_push(1))
    wait_until(lambda: inside, 10, "the first writer at its group")
    assert inside == [["agent-1"]]
    # another new node: stored and answered while the first writer still waits
    assert d.submit(_lane_push(2)).result(20).result.written["gpu_sample"] == 8
    known = d.submit(_lane_push(0, T0 + dt.timedelta(seconds=10)))
    time.sleep(0.3)
    assert not known.done() and inside == [["agent-1"], ["agent-2"]]
    gate.set()
    assert first.result(30).result.written["gpu_sample"] == known.result(30).result.written["gpu_sample"] == 8
    assert inside[2] == ["agent-0"]
    d.close()
    assert _count(store, "gpu_sample") == 4 * 8


def test_two_writers_answer_every_push_after_its_commit(db_url):
    """Two writer threads (FLEETSCOPE_INGEST_WRITERS=2): every push stored and answered once, each answer with
    its own rows."""
    st = Store.open(db_url)
    d = door.Door(st, window_s=0.0, writers=2)
    with cf.ThreadPoolExecutor(8) as pool:
        results = list(pool.map(lambda h: d.accept(_agent_push(h), 60), range(48)))
    d.close()
    assert [r.result.written["gpu_sample"] for r in results] == [8] * 48
    assert _count(st, "gpu_sample") == 48 * 8
    assert _count(st, "ingest_log") == 48
    st.engine.dispose()
