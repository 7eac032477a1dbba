"""Beat's scheduler for several beats at once: only the leader sends.

``fleetscope beat`` may run on two or more hosts for availability. Each runs this Celery ``Scheduler``, whose
tick first asks the lease (``services/leader.py``, table ``beat_lease``): the holder ticks as Celery's own
scheduler does, the others only keep asking, so each schedule fires from one beat at a time. What was sent
last is in the database (``beat_entry``), not in a file of one host's, so a beat that takes the lease over
goes on from the last send: an interval entry sent 40 s ago by the old leader is due in 20 s, a crontab entry
whose time passed while nobody led is sent once at takeover, and one the old leader sent is not sent again.

Each tick also touches ``beat-heartbeat-<hostname>`` in the data directory (shared by the compose stack's
containers, hence the host's name), which the compose health check reads.
"""

from __future__ import annotations

import contextlib
import logging
import socket
from typing import Any

from celery.beat import Scheduler
from sqlalchemy import select
from sqlalchemy.dialects import postgresql, sqlite

from fleetscope import settings as settings_mod
from fleetscope.services.leader import Lease
from fleetscope.store import db, schema

log = logging.getLogger(__name__)

LEASE_NAME = "beat"
HEARTBEAT_FILE = "beat-heartbeat"


class LeaderScheduler(Scheduler):
    """Celery's in-memory scheduler, sending only while this beat holds the ``beat`` lease."""

    def __init__(self, app: Any, *args: Any, **kwargs: Any) -> None:
        settings: settings_mod.Settings = app.conf.fleetscope_settings
        self.engine = db.make_engine(settings.database_url)
        self.lease = Lease(self.engine, LEASE_NAME, settings.beat_lease_s)
        self._leading = False
        self._heartbeat = settings.data_dir / f"{HEARTBEAT_FILE}-{socket.gethostname()}"
        kwargs.pop("schedule_filename", None)  # the schedule's state lives in the database
        super().__init__(app, *args, **kwargs)

    def tick(self, *args: Any, **kwargs: Any) -> float:
        with contextlib.suppress(OSError):
            self._heartbeat.touch()
        if not self.lease.held():
            self._leading = False
            return max(0.05, min(self.lease.seconds_to_next_ask(), self.max_interval))
        if not self._leading:
            self._resume()
            self._leading = True
        # wake for the next renewal too, so the lease never lapses under a long sleep
        return min(super().tick(*args, **kwargs), self.lease.seconds_to_next_ask())

    def _resume(self) -> None:
        """On taking the lead: each entry's last send from the database, where any earlier leader left it."""
        t = schema.beat_entry
        with self.engine.connect() as conn:
            sent = {r.name: r for r in conn.execute(select(t.c.name, t.c.last_run_at, t.c.total_run_count))}
        for name, entry in self.schedule.items():
            if name in sent:
                entry.last_run_at = sent[name].last_run_at
                entry.total_run_count = sent[name].total_run_count
        self._heap = None  # rebuilt from the entries at the next tick

    def apply_entry(self, entry: Any, producer: Any = None) -> None:
        # The lease is checked again on this process's clock: a tick that ran long must not send past it.
        if not self.lease.held_locally():
            log.warning("beat: not sending %s, the lease ran out during the tick", entry.name)
            return
        super().apply_entry(entry, producer=producer)
        sent = self.schedule[entry.name]  # reserve() put the advanced entry there
        self._record(entry.name, sent.last_run_at, sent.total_run_count)

    def _record(self, name: str, last_run_at: Any, total_run_count: int) -> None:
        t = schema.beat_entry
        ins = (postgresql.insert(t) if self.engine.dialect.name == "postgresql" else sqlite.insert(t)).values(
            name=name, last_run_at=last_run_at, total_run_count=total_run_count)
        stmt = ins.on_conflict_do_update(index_elements=[t.c.name], set_={"last_run_at": ins.excluded.last_run_at,
                                                                          "total_run_count": ins.excluded.total_run_count})
        try:
            with self.engine.begin() as conn:
                conn.execute(stmt)
        except Exception:  # noqa: BLE001 - a missed record re-sends the entry after a takeover, no worse
            log.exception("beat: could not record the send of %s", name)

    def close(self) -> None:
        try:
            if self._leading or self.lease.held_locally():
                self.lease.release()  # the next beat takes over at its next ask, not at expiry
        finally:
            super().close()
            self.engine.dispose()

    @property
    def info(self) -> str:
        return f"    . leader lease -> {LEASE_NAME} ({self.lease.lease_s:g} s) as {self.lease.holder}"
