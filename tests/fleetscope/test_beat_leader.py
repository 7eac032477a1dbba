"""Beat with one leader: the lease (services/leader.py) and two real `celery beat` processes on the shipped
LeaderScheduler (worker/beat.py) against PostgreSQL, one of them SIGKILLed."""

from __future__ import annotations

import datetime as dt
import os
import re
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from sqlalchemy import delete, select

from fleetscope.services.leader import Lease, current
from fleetscope.store import db, schema
from tests.conftest import wait_until


def test_one_holder_at_a_time_and_a_lapsed_lease_passes_on(db_url: str) -> None:
    engine = db.make_engine(db_url)
    a, b = Lease(engine, "t", 1.0, holder="a"), Lease(engine, "t", 1.0, holder="b")
    assert a.try_acquire() and not b.try_acquire()
    assert current(engine, "t")["holder"] == "a"
    time.sleep(0.5)
    assert a.try_acquire() and not b.try_acquire()  # a renewal keeps it from lapsing
    assert a.held_locally()
    # a stops renewing: its own clock gives up before the database does, and only then may b take it
    time.sleep(0.92)
    assert not a.held_locally()
    wait_until(b.try_acquire, 2.0, "b to take the lapsed lease")
    assert current(engine, "t")["holder"] == "b"
    assert not a.try_acquire() and not a.held_locally()
    # a clean stop hands it on at once
    b.release()
    assert not b.held_locally() and a.try_acquire()
    engine.dispose()


def test_a_database_outage_ends_the_lead_on_the_holder_s_own_clock(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'fs.db'}"
    db.upgrade(url)
    engine = db.make_engine(url)
    lease = Lease(engine, "t", 1.0, holder="a")
    assert lease.try_acquire()
    with engine.begin() as conn:
        conn.exec_driver_sql("DROP TABLE beat_lease")  # every later ask fails
    assert lease.try_acquire()  # what is left of the last lease still counts...
    time.sleep(0.95)
    assert not lease.try_acquire() and not lease.held()  # ...and no more
    engine.dispose()


def test_the_new_leader_goes_on_from_the_last_sends(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A scheduler taking the lead reads each entry's last send from beat_entry: an entry the old leader sent a
    moment ago is not due, one it last sent long ago is."""
    from tests.conftest import make_settings
    from fleetscope.worker import make_celery
    from fleetscope.worker.beat import LeaderScheduler

    url = f"sqlite:///{tmp_path / 'fs.db'}"
    db.upgrade(url)
    app = make_celery(make_settings(tmp_path, url))
    app.conf.fleetscope_settings = make_settings(tmp_path, url)
    app.conf.beat_schedule = {"fresh": {"task": "t.fresh", "schedule": 60.0}, "stale": {"task": "t.stale", "schedule": 60.0}}
    sent: list[str] = []
    monkeypatch.setattr(LeaderScheduler, "apply_async", lambda self, entry, producer=None, advance=True, **kw: sent.append(entry.name))
    now = dt.datetime.now(dt.UTC)
    engine = db.make_engine(url)
    with engine.begin() as conn:
        conn.execute(schema.beat_entry.insert(), [{"name": "fresh", "last_run_at": now - dt.timedelta(seconds=5), "total_run_count": 7},
                                                  {"name": "stale", "last_run_at": now - dt.timedelta(seconds=600), "total_run_count": 3}])
    sched = LeaderScheduler(app, lazy=False)
    for _ in range(5):
        sched.tick()
    assert sent == ["stale"]
    with engine.connect() as conn:
        rows = dict(conn.execute(select(schema.beat_entry.c.name, schema.beat_entry.c.total_run_count)).all())
    assert rows == {"fresh": 7, "stale": 4}
    assert (tmp_path / f"beat-heartbeat-{os.uname().nodename}").exists()
    sched.close()
    # a clean stop releases the lease: the next beat leads at its first ask
    assert current(engine, "beat")["expires_at"] < now
    engine.dispose()


BEAT = """
import sys
from fleetscope.worker import celery_app
celery_app.conf.beat_schedule = {"tick": {"task": "fleetscope.test_tick", "schedule": 0.25, "options": {"queue": sys.argv[1]}}}
celery_app.start(["beat", "--loglevel=INFO"])
"""
SENT = re.compile(r"Sending due task tick")


def broker_matches_log(r: object, queue: str, sends: object) -> bool:
    logged_before = sum(sends())
    queued = r.llen(queue)
    logged_after = sum(sends())
    return logged_before - 1 <= queued <= logged_after


@pytest.mark.postgres
@pytest.mark.redis
@pytest.mark.slow
def test_two_beats_send_from_one_and_the_other_takes_over_when_it_is_killed(pg_migrated: str, redis_url: str, tmp_path: Path) -> None:
    import redis

    engine = db.make_engine(pg_migrated)
    with engine.begin() as conn:
        conn.execute(delete(schema.beat_lease))
        conn.execute(delete(schema.beat_entry))
    queue = f"beat-test-{uuid.uuid4().hex[:8]}"
    lease_s = 2.0
    procs, logs = [], []
    env = {**os.environ, "FLEETSCOPE_DATABASE_URL": pg_migrated, "FLEETSCOPE_BROKER_URL": redis_url, "FLEETSCOPE_RESULT_BACKEND": redis_url,
           "FLEETSCOPE_AUTO_MIGRATE": "false", "FLEETSCOPE_BEAT_LEASE_S": str(lease_s)}
    r = redis.Redis.from_url(redis_url)
    try:
        for name in ("a", "b"):
            log = tmp_path / f"beat-{name}.log"
            logs.append(log)
            procs.append(subprocess.Popen([sys.executable, "-c", BEAT, queue], env={**env, "FLEETSCOPE_DATA_DIR": str(tmp_path / name)},
                                          stdout=log.open("wb"), stderr=subprocess.STDOUT))
        sends = lambda: [len(SENT.findall(log.read_text(errors="replace"))) for log in logs]  # noqa: E731
        wait_until(lambda: sum(sends()) >= 4, 30, "the first sends")
        time.sleep(2.0)  # both beats are up and ticking by now
        before = sends()
        leader = 0 if before[0] else 1
        assert before[1 - leader] == 0, before  # one sends, the other only asks
        assert before[leader] >= 8
        holder = current(engine, "beat")["holder"]
        assert holder.split(":")[1] == str(procs[leader].pid)
        # what the leader's log says it sent is what the broker holds; the beat keeps ticking while we read both, and logs
        # a send just before it hands it to the broker, so the count is bracketed by two reads of the log
        assert broker_matches_log(r, queue, sends), (r.llen(queue), sends())

        procs[leader].send_signal(signal.SIGKILL)
        procs[leader].wait(timeout=10)
        killed_at = time.monotonic()
        at_kill = sends()[leader]
        wait_until(lambda: sends()[1 - leader] > 0, lease_s * 2 + 5, "the other beat to take over")
        took_s = time.monotonic() - killed_at
        # the lease runs out at most lease_s after the dead leader's last renewal, and the follower asks every third of it
        assert took_s <= lease_s * (1 + 1 / 3) + 1.0, took_s
        time.sleep(1.0)
        after = sends()
        assert after[leader] == at_kill and after[1 - leader] >= 2
        assert current(engine, "beat")["holder"].split(":")[1] == str(procs[1 - leader].pid)
        assert broker_matches_log(r, queue, sends), (r.llen(queue), sends())
    finally:
        for p in procs:
            if p.poll() is None:
                p.terminate()
                try:
                    p.wait(timeout=15)
                except subprocess.TimeoutExpired:
                    p.kill()
        r.delete(queue)
        engine.dispose()
