"""The gpu rows of agents' pushes (``Store.write_rows``) are not upserted again while the process knows them
stored (``store.inventory.InventoryRows``), and are the moment anything else may have changed them."""

from __future__ import annotations

import concurrent.futures as cf
import datetime as dt
import importlib.util
import threading
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import text

from fleetscope import door
from fleetscope.core import frames as F
from fleetscope.core.errors import ValidationError
from fleetscope.door import ingestion
from fleetscope.store import Rows, Store, WriteResult, pg_write
from fleetscope.store.inventory import InventoryRows
from ingest import dcgm

REPO = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("_bench_dcgm", REPO / "benchmarks" / "ingest_dcgm.py")
_bench = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_bench)
T0 = dt.datetime(2026, 6, 1, tzinfo=dt.UTC)
GPU_COLUMNS = ("gpu_uuid", "host", "gpu_index", "model_name", "driver_version")


def _rows(gpus: range = range(6), driver: str = "580.1") -> Rows:
    return Rows(GPU_COLUMNS, [(f"g{i}", f"n{i // 3}", i % 3, "H100", driver) for i in gpus])


def _write(store: Store, gpu: Rows) -> WriteResult:
    return store.write_rows([(F.FRAMES["gpu"], gpu)], ingest_log=lambda r: [("test", None, r.written, 0)])


def _upserts(store: Store, monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """``"sent"`` for each gpu upsert from now on that reached the database (a skipped one is not sent)."""
    seen: list[Any] = []
    if store.dialect == "sqlite":
        insert = store._insert

        def counting(conn, table, df, key, on_conflict):  # type: ignore[no-untyped-def]
            if table == "gpu":
                seen.append("sent")
            return insert(conn, table, df, key, on_conflict)

        monkeypatch.setattr(store, "_insert", counting)
    else:
        execute = pg_write.execute_unnest

        def recording(cur, table, rows, key, conflict):  # type: ignore[no-untyped-def]
            if table == "gpu":
                seen.append("sent")
            return execute(cur, table, rows, key, conflict)

        monkeypatch.setattr(pg_write, "execute_unnest", recording)
    return seen


def _counter(store: Store) -> int:
    with store.engine.connect() as conn:
        version = store._inventory.version(conn)
    assert version is not None
    return version


def _skipped(seen: list[Any]) -> bool:
    """Whether the last write's gpu upsert was skipped (not sent)."""
    return not seen


def _logged(store: Store) -> int:
    return int(store.query("SELECT COUNT(*) AS n FROM ingest_log", (), {})["n"][0])


def _stored(store: Store) -> list[tuple[Any, ...]]:
    return sorted(tuple(r) for r in store.query(f"SELECT {', '.join(GPU_COLUMNS)} FROM gpu", (), {}).rows())


def test_known_rows_are_not_upserted_again(store: Store, monkeypatch: pytest.MonkeyPatch):
    assert _write(store, _rows()).written["gpu"] == 6
    seen = _upserts(store, monkeypatch)
    assert _write(store, _rows()).written["gpu"] == 0
    assert _skipped(seen)
    assert _stored(store) == _rows().rows
    # A row that differs is upserted, and what it changes is stored.
    seen.clear()
    assert _write(store, _rows(driver="580.2")).written["gpu"] == 6 and not _skipped(seen)
    assert {r[-1] for r in _stored(store)} == {"580.2"}


@pytest.mark.parametrize("change", ["another store", "sql update", "sql delete"])
def test_rows_changed_elsewhere_are_written_again(store: Store, monkeypatch: pytest.MonkeyPatch, change: str):
    """Another process's change (or an operator's) moves the counter: the next push's rows are upserted and
    put back as the push has them."""
    _write(store, _rows())
    seen = _upserts(store, monkeypatch)
    if change == "another store":
        other = Store(store.engine)  # another process: nothing remembered
        moved = Rows(GPU_COLUMNS, [("g4", "n9", 1, "H100", "580.1")])
        assert _write(other, moved).written["gpu"] == 1
    else:
        with store.engine.begin() as conn:
            conn.exec_driver_sql("UPDATE gpu SET host = 'n9' WHERE gpu_uuid = 'g4'" if change == "sql update" else
                                 "DELETE FROM gpu WHERE gpu_uuid = 'g4'")
    seen.clear()
    assert _write(store, _rows()).written["gpu"] == 1
    assert not _skipped(seen)
    assert _stored(store) == _rows().rows
    seen.clear()
    assert _write(store, _rows()).written["gpu"] == 0 and _skipped(seen)


def test_a_push_that_finds_the_counter_moved_is_written_once_whole(store: Store, monkeypatch: pytest.MonkeyPatch):
    """PostgreSQL leaves a known group's upsert out and reads the counter instead; found moved, the write is
    rolled back and sent again with the upsert. Its other rows, its counts and its ingest-log row come out
    as one write's, and the memory starts again from what it stored."""
    if store.dialect != "postgresql":
        pytest.skip("SQLite reads the counter before its upsert, in its writers' turn")
    t_us = int(T0.timestamp() * 1e6)
    samples = Rows(("ts", "gpu_uuid", "power_w"), [(t_us, f"g{i}", 300.0 + i) for i in range(6)])

    def push() -> WriteResult:
        return store.write_rows([(F.FRAMES["gpu"], _rows()), (F.FRAMES["gpu_sample"], samples)],
                                ingest_log=lambda r: [("test", None, r.written, 0)])

    push()
    assert store._inventory.rows.known_at(_rows()) == _counter(store)
    with store.engine.begin() as conn:
        conn.exec_driver_sql("UPDATE gpu SET host = 'n9' WHERE gpu_uuid = 'g4'")
    moved = _counter(store)
    logged = _logged(store)
    seen = _upserts(store, monkeypatch)
    again = push()
    assert seen == ["sent"]  # the first try sent no upsert; the second, after the rollback, did
    assert again.written == {"gpu": 1, "gpu_sample": 0}
    assert _logged(store) == logged + 1
    assert _stored(store) == _rows().rows
    assert store._inventory.rows.known_at(_rows()) == _counter(store) == moved + 1


def test_a_group_of_new_and_known_gpus_is_upserted_whole(store: Store, monkeypatch: pytest.MonkeyPatch):
    _write(store, _rows(range(6)))
    seen = _upserts(store, monkeypatch)
    assert _write(store, _rows(range(12))).written["gpu"] == 6 and not _skipped(seen)
    assert _stored(store) == sorted(_rows(range(12)).rows)
    seen.clear()
    assert _write(store, _rows(range(3, 9))).written["gpu"] == 0 and _skipped(seen)


def test_a_write_rolled_back_is_not_remembered(store: Store, monkeypatch: pytest.MonkeyPatch):
    log = store._log_ingest

    def failing(conn, entries):  # type: ignore[no-untyped-def]
        raise RuntimeError("the write fails after its gpu upsert")

    monkeypatch.setattr(store, "_log_ingest", failing)
    with pytest.raises(RuntimeError):
        _write(store, _rows())
    monkeypatch.setattr(store, "_log_ingest", log)
    assert _stored(store) == []
    assert _write(store, _rows()).written["gpu"] == 6
    assert _stored(store) == _rows().rows


def test_the_memory_follows_only_changes_it_can_account_for():
    mem, a, b = InventoryRows(), _rows(range(3)), _rows(range(3, 6))
    assert mem.known_at(a) is None
    mem.confirm(a, 10, 13, 3)  # inserted, and nothing else moved the counter
    assert mem.known_at(a) == 13
    mem.confirm(b, 13, 16, 3)  # the next change was this write's own: a's rows still hold
    assert mem.known_at(a) == 16 and mem.known_at(b) == 16
    mem.confirm(a, 20, 20, 0)  # something else moved the counter from 16 to 20: only a is known there
    assert mem.known_at(a) == 20 and mem.known_at(b) is None
    mem.confirm(b, 20, 25, 3)  # two more changes than this write made: another writer's among them
    assert mem.known_at(b) is None and mem.known_at(a) == 20
    mem.confirm(b, 18, 20, 2)  # a write decided before the last, committed after it, ending where it began
    assert mem.known_at(b) == 20 and mem.known_at(a) == 20
    mem.confirm(a, 17, 19, 2)  # older than what is known: ignored
    assert mem.known_at(a) == 20
    assert mem.known_at(_rows(range(3), driver="580.2")) is None  # a row that differs


def _agent_push(h: int, when: dt.datetime = T0) -> door.Push:
    body = _bench.synth_scrape(8, first_gpu=8 * h, seed=h)
    return ingestion.to_push(body, source=f"agent-{h}", fmt="dcgm", opts=ingestion.Options(ts=when))


def _gated(store: Store) -> tuple[door.Door, threading.Event]:
    gate = threading.Event()
    d = door.Door(store, window_s=0.0, writers=1, max_future_skew_s=300)
    original = d._commit

    def commit(group):  # type: ignore[no-untyped-def]
        gate.wait(10)
        return original(group)

    d._commit = commit  # type: ignore[method-assign]
    return d, gate


def _inventory_of(hosts: list[int]) -> list[tuple[Any, ...]]:
    """The gpu rows the columnar parser reads from the nodes' bodies."""
    frames = [dcgm.parse(_bench.synth_scrape(8, first_gpu=8 * h, seed=h), source="x", ts=T0).gpu for h in hosts]
    rows = [tuple(r) for f in frames for r in f.select("gpu_uuid", "host", "gpu_index", "pci_bus_id", "model_name", "driver_version").rows()]
    return sorted(rows)


def _stored_inventory(store: Store) -> list[tuple[Any, ...]]:
    return sorted(tuple(r) for r in store.query("SELECT gpu_uuid, host, gpu_index, pci_bus_id, model_name, driver_version FROM gpu", (),
                                                {}).rows())


def test_a_group_of_new_nodes_creates_their_inventory_in_one_write(store: Store, monkeypatch: pytest.MonkeyPatch):
    d, gate = _gated(store)
    first = d.submit(_agent_push(0))  # held at the gate while the others queue behind it
    rest = [d.submit(_agent_push(h)) for h in range(1, 16)]
    seen = _upserts(store, monkeypatch)
    gate.set()
    results = [f.result(30) for f in [first, *rest]]
    # two groups: the first push's (with any queued before the writer took it) and the others' together,
    # each one gpu upsert
    assert sum(1 / r.group_size for r in results) <= 2.01 and len(seen) <= 2
    assert all(r.result.written["gpu"] == 8 and r.result.written["gpu_sample"] == 8 for r in results)
    assert _stored_inventory(store) == _inventory_of(list(range(16)))
    # A round later, new nodes and known ones together: the known ones' rows stay, the new ones' are added.
    seen.clear()
    later = T0 + dt.timedelta(seconds=10)
    mixed = [d.submit(_agent_push(h, later)) for h in range(8, 24)]
    results = [f.result(30) for f in mixed]
    assert sum(r.result.written["gpu"] for r in results) == 8 * 8
    assert _stored_inventory(store) == _inventory_of(list(range(24)))
    # And a round after, every node known: no inventory upsert at all.
    seen.clear()
    known = [d.submit(_agent_push(h, later + dt.timedelta(seconds=10))) for h in range(24)]
    assert all(f.result(30).result.written["gpu"] == 0 for f in known)
    assert seen == [] if store.dialect == "sqlite" else all(v != "sent" for v in seen)
    d.close()
    assert _stored_inventory(store) == _inventory_of(list(range(24)))


def test_a_bad_push_among_new_nodes_is_refused_alone(store: Store):
    d, gate = _gated(store)
    first = d.submit(_agent_push(0))
    good = [d.submit(_agent_push(h)) for h in range(1, 6)]
    ahead = d.submit(_agent_push(6, dt.datetime.now(dt.UTC) + dt.timedelta(hours=1)))  # past the allowed skew
    more = [d.submit(_agent_push(h)) for h in range(7, 10)]
    gate.set()
    for f in [first, *good, *more]:
        assert f.result(30).result.written["gpu"] == 8
    with pytest.raises(ValidationError):
        ahead.result(30)
    d.close()
    hosts = [0, 1, 2, 3, 4, 5, 7, 8, 9]
    assert _stored_inventory(store) == _inventory_of(hosts)
    with store.engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM ingest_log")).scalar_one() == len(hosts)


def test_a_failed_group_write_leaves_nothing_remembered(store: Store, monkeypatch: pytest.MonkeyPatch):
    """A group whose write fails is written again push by push; a push that fails alone is refused with
    nothing of it remembered, so a later push of the same node creates its rows."""
    log = store._log_ingest

    def failing(conn, entries):  # type: ignore[no-untyped-def]
        if any(source == "agent-2" for source, *_ in entries):
            raise RuntimeError("this push's write fails")
        return log(conn, entries)

    monkeypatch.setattr(store, "_log_ingest", failing)
    d, gate = _gated(store)
    futs = [d.submit(_agent_push(h)) for h in range(4)]
    gate.set()
    done = cf.wait(futs, timeout=30).done
    assert len(done) == 4
    assert [f.exception() is None for f in futs] == [True, True, False, True]
    assert _stored_inventory(store) == _inventory_of([0, 1, 3])
    monkeypatch.setattr(store, "_log_ingest", log)
    assert d.accept(_agent_push(2, T0 + dt.timedelta(seconds=10)), timeout_s=30).result.written["gpu"] == 8
    d.close()
    assert _stored_inventory(store) == _inventory_of([0, 1, 2, 3])

