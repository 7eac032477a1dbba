"""Leader election over the store: a lease row that one process holds at a time (beat's, ``worker/beat.py``).

A lease (Gray & Cheriton, "Leases", SOSP 1989) rather than a session lock, so the same code runs on SQLite and
PostgreSQL and a holder cut off from the database stops leading on its own clock: the holder renews its row
before ``expires_at``; anyone may take a row whose ``expires_at`` has passed, in one conditional ``UPDATE`` the
database serialises, so two contenders never both win. Expiry is judged by the database's clock on PostgreSQL
(every contender reads the same one) and by the host's on SQLite (one host). The holder itself counts its
lease from the moment it *asked* for it, on its monotonic clock, and stops leading a margin before that runs
out: a holder cut off past its lease (a lost network, a database that does not answer) stops before a
successor can start. Only a pause between its last check and the send itself (a stopped process) can
overlap by that one send.
"""

from __future__ import annotations

import datetime as dt
import logging
import os
import secrets
import socket
import time

from sqlalchemy import case, func, insert, literal, select, update
from sqlalchemy.engine import Engine
from sqlalchemy.exc import IntegrityError

from fleetscope.store import schema
from fleetscope.store.sqltypes import UTCDateTime

log = logging.getLogger(__name__)

SAFETY_MARGIN = 0.1
"""The fraction of a lease its holder gives up before it runs out, for the contenders' clocks and the database's
round trips."""


_NONCE = secrets.token_hex(4)


def holder_id() -> str:
    """This process's name in the lease table: host, pid and a nonce (a pid is reused after a restart, in
    another container too)."""
    return f"{socket.gethostname()}:{os.getpid()}:{_NONCE}"


class Lease:
    """The lease ``name`` as seen by ``holder``: ``held()`` says whether this process leads now, asking the
    database (acquiring or renewing) whenever a third of the lease has passed since it last asked."""

    def __init__(self, engine: Engine, name: str, lease_s: float, holder: str | None = None):
        if lease_s <= 0:
            raise ValueError(f"lease_s={lease_s}: expected a positive number of seconds")
        self.engine, self.name, self.lease_s = engine, name, float(lease_s)
        self.holder = holder or holder_id()
        self.renew_s = self.lease_s / 3
        self._valid_until = 0.0  # monotonic: leading until then, unless renewed
        self._asked_at = -float("inf")

    def _now(self, conn) -> dt.datetime:  # type: ignore[no-untyped-def]
        if self.engine.dialect.name == "postgresql":
            return conn.execute(select(func.now())).scalar_one()
        return dt.datetime.now(dt.UTC)

    def try_acquire(self) -> bool:
        """Take or renew the lease if it is free, expired or ours; True when this process holds it now."""
        t = schema.beat_lease
        asked = time.monotonic()
        self._asked_at = asked
        try:
            with self.engine.begin() as conn:
                now = self._now(conn)
                expires = now + dt.timedelta(seconds=self.lease_s)
                won = conn.execute(
                    update(t).where(t.c.name == self.name, (t.c.holder == self.holder) | (t.c.expires_at < now))
                    .values(holder=self.holder, expires_at=expires, acquired_at=case((t.c.holder == self.holder, t.c.acquired_at), else_=literal(now, UTCDateTime())))
                ).rowcount == 1
                if not won and conn.execute(select(t.c.name).where(t.c.name == self.name)).first() is None:
                    conn.execute(insert(t).values(name=self.name, holder=self.holder, expires_at=expires, acquired_at=now))
                    won = True
        except IntegrityError:  # another contender inserted the first row at the same moment: it leads
            won = False
        except Exception:  # noqa: BLE001 - the database is away: lead only on what is left of the last lease
            log.exception("lease %s: could not reach the database", self.name)
            return self.held_locally()
        was = self.held_locally()
        self._valid_until = asked + self.lease_s * (1 - SAFETY_MARGIN) if won else 0.0
        if won and not was:
            log.info("lease %s: %s leads", self.name, self.holder)
        elif was and not won:
            log.warning("lease %s: %s lost the lead", self.name, self.holder)
        return won

    def held_locally(self) -> bool:
        """Whether the last lease this process won has time left on its own clock (no database round trip)."""
        return time.monotonic() < self._valid_until

    def held(self) -> bool:
        """Whether this process leads now: from its last answer while that is fresh, else from the database."""
        if time.monotonic() - self._asked_at >= self.renew_s:
            return self.try_acquire()
        return self.held_locally()

    def seconds_to_next_ask(self) -> float:
        """How long until ``held`` next asks the database."""
        return max(0.0, self._asked_at + self.renew_s - time.monotonic())

    def release(self) -> None:
        """Give the lease up (a clean stop), so another process takes it at its next ask rather than at expiry."""
        self._valid_until = 0.0
        t = schema.beat_lease
        try:
            with self.engine.begin() as conn:
                conn.execute(update(t).where(t.c.name == self.name, t.c.holder == self.holder)
                             .values(expires_at=dt.datetime(1970, 1, 1, tzinfo=dt.UTC)))
        except Exception:  # noqa: BLE001 - it expires on its own
            log.exception("lease %s: could not release", self.name)


def current(engine: Engine, name: str) -> dict[str, object] | None:
    """The lease row ``name`` (holder, expires_at, acquired_at), or None when nobody ever held it."""
    t = schema.beat_lease
    with engine.connect() as conn:
        row = conn.execute(select(t.c.holder, t.c.expires_at, t.c.acquired_at).where(t.c.name == name)).first()
    return dict(row._mapping) if row else None
