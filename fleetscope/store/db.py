"""Engines and schema migrations: the only place that decides how Fleetscope talks to its database."""

from __future__ import annotations

import contextlib
import logging
import time
from pathlib import Path
from typing import Any

from sqlalchemy import BigInteger, DateTime, Engine, String, create_engine, event, inspect
from sqlalchemy.exc import DisconnectionError

from fleetscope import safefiles
from fleetscope.store import gpu_keys, packed, packed_energy, partitions, schema

from fleetscope.settings import Settings
import uuid
from sqlalchemy import text

log = logging.getLogger(__name__)

MIGRATIONS_DIR = Path(__file__).resolve().parents[2] / "migrations"


def _sqlite_pragmas(dbapi_conn, _record) -> None:  # type: ignore[no-untyped-def]
    cur = dbapi_conn.cursor()
    # WAL lets the API, the worker and the dashboard read while one of them writes; NORMAL sync is
    # durable across process crashes (not power loss) and several times faster than FULL in WAL mode.
    cur.execute("PRAGMA journal_mode=WAL")
    cur.execute("PRAGMA synchronous=NORMAL")
    cur.execute("PRAGMA foreign_keys=ON")
    cur.execute("PRAGMA busy_timeout=30000")
    cur.execute("PRAGMA cache_size=-262144")  # 256 MiB page cache: the gpu_sample key index stays hot
    cur.execute("PRAGMA temp_store=MEMORY")
    cur.close()


def sqlite_file(url: str) -> Path | None:
    """The database file of a SQLite URL (``sqlite:///``, Celery's ``sqla+sqlite:///`` and ``db+sqlite:///``);
    None for another database or an in-memory one."""
    scheme, sep, rest = url.partition(":///")
    if not sep or "sqlite" not in scheme.split("+"):
        return None
    path = rest.split("?", 1)[0]
    return Path(path) if path and path != ":memory:" else None


def create_sqlite_file(url: str) -> None:
    """Create a SQLite URL's database file (and its folder) private to this account, if it is not there yet:
    SQLite gives the ``-wal`` and ``-shm`` files it adds the database file's mode."""
    path = sqlite_file(url)
    if path is not None:
        safefiles.create_private(path)


def make_engine(url: str) -> Engine:
    """An engine for ``url``; SQLite files get their directory created (0700), the file itself (0600) and WAL mode."""
    if url.startswith("sqlite"):
        create_sqlite_file(url)
        engine = create_engine(url, connect_args={"check_same_thread": False, "timeout": 30})
        event.listen(engine, "connect", _sqlite_pragmas)
        return engine
    if url.startswith("postgresql://"):
        url = "postgresql+psycopg://" + url[len("postgresql://") :]
    engine = create_engine(url)
    event.listen(engine, "checkin", _idle_from)
    event.listen(engine, "checkout", _ping_if_idle)
    return engine


PING_AFTER_IDLE_S = 1.0
"""A pooled PostgreSQL connection idle longer than this is pinged before use (a server restart, an idle
timeout); one back sooner is not. SQLAlchemy's ``pool_pre_ping`` pings at every checkout: a round trip
before each of an ingest group's two checkouts, on the writer's critical path."""


def _idle_from(_dbapi_conn: Any, record: Any) -> None:
    record.info["idle_since"] = time.monotonic()


def _ping_if_idle(dbapi_conn: Any, record: Any, _proxy: Any) -> None:
    """SQLAlchemy's pessimistic disconnect handling, for idle connections only: a failed ping raises
    ``DisconnectionError``, and the pool replaces the connection and checks out again
    (https://docs.sqlalchemy.org/en/20/core/pooling.html#custom-legacy-pessimistic-ping)."""
    since = record.info.get("idle_since")
    if since is None or time.monotonic() - since < PING_AFTER_IDLE_S:
        return
    try:
        with dbapi_conn.cursor() as cur:
            cur.execute("SELECT 1")
        if not dbapi_conn.autocommit:
            dbapi_conn.rollback()  # the ping's implicit transaction: the pool hands out connections idle
    except Exception as exc:  # noqa: BLE001 - any failure: this connection is not to be used
        raise DisconnectionError(f"pooled connection failed its ping: {exc}") from exc


def alembic_config(url: str):  # type: ignore[no-untyped-def]
    from alembic.config import Config  # lazy: Alembic, only to migrate

    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS_DIR))
    cfg.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    return cfg


def upgrade(url: str, revision: str = "head") -> None:
    """Migrate the database at ``url`` to ``revision``."""
    from alembic import command  # lazy: Alembic, only to migrate

    command.upgrade(alembic_config(url), revision)


def downgrade(url: str, revision: str = "base") -> None:
    from alembic import command  # lazy: Alembic, only to migrate

    command.downgrade(alembic_config(url), revision)


def current_revision(engine: Engine) -> str | None:
    from alembic.runtime.migration import MigrationContext  # lazy: Alembic, only to migrate

    with engine.connect() as conn:
        return MigrationContext.configure(conn).get_current_revision()


def head_revision(url: str) -> str | None:
    from alembic.script import ScriptDirectory  # lazy: Alembic, only to migrate

    return ScriptDirectory.from_config(alembic_config(url)).get_current_head()


def ensure_schema(settings: Settings, engine: Engine) -> None:
    """Upgrade on first start where the settings allow it (the embedded default); otherwise refuse to
    run on a database that is behind, with the command that fixes it."""
    current = current_revision(engine)
    head = head_revision(settings.database_url)
    if current == head:
        return
    if settings.auto_migrate:
        log.info("migrating %s from %s to %s", engine.url.render_as_string(hide_password=True), current, head)
        upgrade(settings.database_url)
        return
    raise RuntimeError(
        f"database schema is at {current or 'nothing'}, code expects {head}: run `fleetscope db upgrade`"
    )


def replica_lag(primary: Engine, replica: Engine) -> dict[str, Any]:
    """How far a PostgreSQL streaming replica is behind its primary: ``lag_bytes``, the WAL the primary has
    written that the replica has not replayed (``pg_wal_lsn_diff``); ``lag_s``, 0 when it has replayed all of
    it, else the age of the last transaction it replayed, the time its reads are behind (PostgreSQL 16 docs,
    "Monitoring" and §9.27.4 "Recovery Information Functions"); whether replay is paused; ``reachable`` and
    ``in_recovery`` (false: the URL names no replica)."""
    out: dict[str, Any] = {"reachable": False, "in_recovery": False, "lag_bytes": None, "lag_s": None, "replay_paused": None}
    try:
        with primary.connect() as conn:
            primary_lsn = conn.execute(text("SELECT pg_current_wal_lsn()::text")).scalar_one()
        with replica.connect() as conn:
            out["reachable"] = True
            out["in_recovery"] = bool(conn.execute(text("SELECT pg_is_in_recovery()")).scalar_one())
            if not out["in_recovery"]:
                return out
            lag_bytes, age_s, paused = conn.execute(text(
                "SELECT pg_wal_lsn_diff(CAST(:p AS pg_lsn), pg_last_wal_replay_lsn()),"
                " EXTRACT(EPOCH FROM clock_timestamp() - pg_last_xact_replay_timestamp()), pg_is_wal_replay_paused()"),
                {"p": primary_lsn}).one()
    except Exception:  # noqa: BLE001 - reported, not raised: health and the CLI show it
        log.warning("replica lag: a database does not answer", exc_info=True)
        return out
    lag_bytes = max(0, int(lag_bytes or 0))
    out.update(lag_bytes=lag_bytes, lag_s=round(float(age_s or 0.0), 3) if lag_bytes else 0.0, replay_paused=bool(paused))
    return out


def table_names(engine: Engine) -> list[str]:
    return sorted(inspect(engine).get_table_names())


def compare_type(ctx, inspected_column, metadata_column, inspected_type, metadata_type):  # type: ignore[no-untyped-def]
    """Alembic type comparison: UTCDateTime is BIGINT on SQLite and timestamptz on PostgreSQL, both as asked;
    on PostgreSQL a string column's collation is compared too (Alembic compares it only where both name one,
    and a column left in the database's default names none: migration 0024)."""
    if isinstance(metadata_type, schema.UTCDateTime):
        if ctx.dialect.name == "sqlite":
            return not isinstance(inspected_type, BigInteger)
        return not (isinstance(inspected_type, DateTime) and inspected_type.timezone)
    if ctx.dialect.name == "postgresql" and isinstance(metadata_type, String) and isinstance(inspected_type, String):
        if metadata_type.dialect_impl(ctx.dialect).collation != inspected_type.collation:
            return True
    return None


def render_item(type_, obj, autogen_context):  # type: ignore[no-untyped-def]
    """Alembic rendering: migrations refer to UTCDateTime by its import, not its repr."""
    if type_ == "type" and isinstance(obj, schema.UTCDateTime):
        autogen_context.imports.add("from fleetscope.store.schema import UTCDateTime")
        return "UTCDateTime()"
    return False


def include_object(obj, name, type_, reflected, compare_to):  # type: ignore[no-untyped-def]
    """Alembic comparison: the day partitions of raw telemetry and their BRIN indexes, and the packed days of
    ``gpu_sample`` and ``gpu_energy_minute`` (PostgreSQL only, made by the migrations, ``store.partitions``,
    ``store.packed`` and ``store.packed_energy``, not declared in the models: arrays have no SQLite form), and
    the integer GPU ids of PostgreSQL's raw samples (``store.gpu_keys``) are not drift."""
    if type_ == "table" and reflected and name and (partitions.is_partition(name) or name in (packed.TABLE, packed_energy.TABLE, gpu_keys.TABLE)):
        return False
    # PostgreSQL's raw samples hold an integer GPU id where the model (and SQLite) hold the UUID (store.gpu_keys)
    if type_ == "column" and getattr(getattr(obj, "table", None), "name", None) == gpu_keys.RAW:
        if (reflected and name == "gpu_id") or (not reflected and name == "gpu_uuid" and compare_to is None):
            return False
    if type_ == "index" and reflected and name and name.endswith("_brin"):
        return False
    return True


def schema_drift(engine: Engine) -> list:
    """What autogenerate would change to make the database match the models (empty = no drift)."""
    from alembic.autogenerate import compare_metadata  # lazy: Alembic, only to migrate
    from alembic.runtime.migration import MigrationContext  # lazy: Alembic, only to migrate

    with engine.connect() as conn:
        ctx = MigrationContext.configure(conn, opts={"compare_type": compare_type, "include_object": include_object})
        return compare_metadata(ctx, schema.metadata)


@contextlib.contextmanager
def scratch_database(admin_url: str, prefix: str = "fleetscope_scratch"):  # type: ignore[no-untyped-def]
    """A new, empty PostgreSQL database for the duration of the block, dropped afterwards: what tests and
    benchmarks use so they never touch a database someone else migrated."""

    admin = create_engine(admin_url.replace("postgresql://", "postgresql+psycopg://", 1), isolation_level="AUTOCOMMIT")
    name = f"{prefix}_{uuid.uuid4().hex[:10]}"
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    try:
        yield admin.url.set(database=name).render_as_string(hide_password=False)
    finally:
        with admin.connect() as conn:
            conn.execute(text(f"SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = '{name}' AND pid <> pg_backend_pid()"))
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}"'))
        admin.dispose()
