"""Settings from environment variables, each with a safe embedded default.

Nothing here opens a connection: the defaults describe an embedded deployment (SQLite in WAL mode and a
SQLite-backed Celery broker in ``FLEETSCOPE_DATA_DIR``) that needs no server, so ``fleetscope demo`` runs
on a laptop with nothing but Python. Production points the URLs at PostgreSQL and Redis.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, fields
from pathlib import Path


def env(name: str, default: str) -> str:
    """``$name``, or ``default`` where it is unset or empty (an empty variable means "the default")."""
    value = os.environ.get(name)
    return default if value is None or value == "" else value


def _bool(name: str, default: bool) -> bool:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    if raw.lower() in ("1", "true", "yes", "on"):
        return True
    if raw.lower() in ("0", "false", "no", "off"):
        return False
    raise ValueError(f"{name}={raw!r}: expected one of 1/0, true/false, yes/no, on/off")


def _int(name: str, default: int) -> int:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        return int(raw)
    except ValueError:
        raise ValueError(f"{name}={raw!r}: expected an integer") from None


def _positive(name: str, default: int) -> int:
    value = _int(name, default)
    if value < 1:
        raise ValueError(f"{name}={value}: expected an integer of at least 1")
    return value


def _float(name: str, default: float) -> float:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = float(raw)
    except ValueError:
        raise ValueError(f"{name}={raw!r}: expected a number") from None
    if not 0 <= value < float("inf"):
        raise ValueError(f"{name}={raw!r}: expected a finite number of at least 0")
    return value


@dataclass(frozen=True)
class Settings:
    """Every setting, with the environment variable that sets it in ``metadata["env"]``."""

    data_dir: Path = field(metadata={"env": "FLEETSCOPE_DATA_DIR", "doc": "where embedded databases, reports and exports live", "default": "./.fleetscope"})
    database_url: str = field(metadata={"env": "FLEETSCOPE_DATABASE_URL", "doc": "SQLAlchemy URL of the store (PostgreSQL in production: postgresql+psycopg://...)", "default": "sqlite:///$FLEETSCOPE_DATA_DIR/fleetscope.store.db"})
    broker_url: str = field(metadata={"env": "FLEETSCOPE_BROKER_URL", "doc": "Celery broker (redis://... in production)", "default": "sqla+sqlite:///$FLEETSCOPE_DATA_DIR/broker.db"})
    result_backend: str = field(metadata={"env": "FLEETSCOPE_RESULT_BACKEND", "doc": "Celery result backend; defaults to the broker's Redis, else SQLite", "default": "db+sqlite:///$FLEETSCOPE_DATA_DIR/results.db"})
    api_host: str = field(metadata={"env": "FLEETSCOPE_API_HOST", "doc": "address `fleetscope serve` binds", "default": "127.0.0.1"})
    api_port: int = field(metadata={"env": "FLEETSCOPE_API_PORT", "doc": "port `fleetscope serve` binds", "default": "8000"})
    api_url: str = field(metadata={"env": "FLEETSCOPE_API_URL", "doc": "where the agent and CLI reach the API", "default": "http://$FLEETSCOPE_API_HOST:$FLEETSCOPE_API_PORT"})
    api_workers: int = field(metadata={"env": "FLEETSCOPE_API_WORKERS", "doc": "processes `fleetscope serve` runs when --workers is not given: on PostgreSQL two overlap one's database waits with the other's parsing (more pushes a second, a node's first push answered sooner); SQLite's writers take turns across processes, so one there", "default": "2 on PostgreSQL with two or more CPUs, else 1"})
    max_body_bytes: int = field(metadata={"env": "FLEETSCOPE_MAX_BODY_BYTES", "doc": "largest request body the API accepts (413 above)", "default": str(256 * 2**20)})
    group_commit_ms: float = field(metadata={"env": "FLEETSCOPE_GROUP_COMMIT_MS", "doc": "how long the ingest door waits for more pushes to commit with the first", "default": "2"})
    ingest_max_pending: int = field(metadata={"env": "FLEETSCOPE_INGEST_MAX_PENDING", "doc": "pushes waiting to be written per API process before 503 + Retry-After", "default": "1024"})
    ingest_max_pending_mb: int = field(metadata={"env": "FLEETSCOPE_INGEST_MAX_PENDING_MB", "doc": "MiB of pushes waiting to be written per API process before 503 + Retry-After; the same again for input being parsed at once", "default": "512"})
    ingest_writers: int = field(metadata={"env": "FLEETSCOPE_INGEST_WRITERS", "doc": "ingest door writer threads per API process; a second commits a group beside the first only where it holds a node's first dcgm push (PostgreSQL; SQLite writes one at a time)", "default": "2"})
    tune_allocator: bool = field(metadata={"env": "FLEETSCOPE_TUNE_ALLOCATOR", "doc": "`fleetscope serve` restarts itself once with jemalloc keeping freed pages 10 s and glibc's malloc on transparent huge pages (Linux), which a large scrape spends a quarter of its CPU on otherwise; 0 leaves `_RJEM_MALLOC_CONF` and `GLIBC_TUNABLES` as given", "default": "true"})
    auto_migrate: bool = field(metadata={"env": "FLEETSCOPE_AUTO_MIGRATE", "doc": "upgrade the schema on first start (default on for SQLite, off otherwise)", "default": "true on SQLite"})
    retention_days: int = field(metadata={"env": "FLEETSCOPE_RETENTION_DAYS", "doc": "raw telemetry kept this long; the EU AI Act asks for at least 183 days of logs", "default": "400"})
    evidence_retention_days: int = field(metadata={"env": "FLEETSCOPE_EVIDENCE_RETENTION_DAYS", "doc": "what the analyses derived (roll-ups, per-step breakdowns, findings, health and job events, the ingest and task logs, monitoring windows, predictions and outcomes) kept this long; at least the raw retention", "default": "1095"})
    minute_tier_retention_days: int = field(metadata={"env": "FLEETSCOPE_MINUTE_TIER_RETENTION_DAYS", "doc": "the 1-minute roll-up tier of GPU telemetry (gpu_sample_minute) kept this long; older ranges read the hour tier and the packed raw days", "default": "35"})
    hour_tier_retention_days: int = field(metadata={"env": "FLEETSCOPE_HOUR_TIER_RETENTION_DAYS", "doc": "the 1-hour roll-up tier of GPU telemetry (gpu_sample_hour) kept this long; at least the minute tier's", "default": "1095"})
    sweep_shards: int = field(metadata={"env": "FLEETSCOPE_SWEEP_SHARDS", "doc": "beat splits the energy roll-up and the health sweep into this many tasks, each over the GPUs of one group of hosts, for the workers to run in parallel", "default": "1"})
    hang_min_stall_s: float = field(metadata={"env": "FLEETSCOPE_HANG_MIN_STALL_S", "doc": "a job with no step for this long (and 10 of its steps) while holding its GPUs is hung; keep it under your collective timeout", "default": "300"})
    idle_allocation_min_s: float = field(metadata={"env": "FLEETSCOPE_IDLE_ALLOCATION_MIN_S", "doc": "GPUs a scheduler job or pod holds at or under 5 % utilisation for this long are an idle allocation (a finding with its cost)", "default": "1800"})
    otel_exporter: str = field(metadata={"env": "FLEETSCOPE_OTEL_EXPORTER", "doc": "tracing of Fleetscope itself: none, console or otlp", "default": "none"})
    otel_endpoint: str = field(metadata={"env": "FLEETSCOPE_OTEL_ENDPOINT", "doc": "OTLP/HTTP traces endpoint when otel_exporter=otlp", "default": "http://127.0.0.1:4318/v1/traces"})
    report_schedule: str = field(metadata={"env": "FLEETSCOPE_REPORT_SCHEDULE", "doc": "crontab (UTC) of the scheduled EU AI Act audit report", "default": "0 6 * * 1"})
    signing_key: str = field(metadata={"env": "FLEETSCOPE_SIGNING_KEY", "doc": "Ed25519 private key (PEM file) that signs export bundles; embedded: generated into the data dir", "default": "$FLEETSCOPE_DATA_DIR/signing_key.pem"})
    audit_key_file: str = field(metadata={"env": "FLEETSCOPE_AUDIT_KEY_FILE", "doc": "secret key (hex) of the audit log's HMAC chain, kept outside the database; embedded: generated into the data dir (0600)", "default": "$FLEETSCOPE_DATA_DIR/audit.key"})
    audit_checkpoint_file: str = field(metadata={"env": "FLEETSCOPE_AUDIT_CHECKPOINT_FILE", "doc": "append-only file of the audit log's signed checkpoints (0600)", "default": "$FLEETSCOPE_DATA_DIR/audit_checkpoints.jsonl"})
    log_level: str = field(metadata={"env": "FLEETSCOPE_LOG_LEVEL", "doc": "Python log level", "default": "INFO"})
    tls_cert: str = field(metadata={"env": "FLEETSCOPE_TLS_CERT", "doc": "PEM certificate (chain) `fleetscope serve` and `fleetscope dashboard` serve HTTPS with; empty: plain HTTP", "default": ""})
    tls_key: str = field(metadata={"env": "FLEETSCOPE_TLS_KEY", "doc": "PEM private key of FLEETSCOPE_TLS_CERT", "default": ""})
    dashboard_auth: str = field(metadata={"env": "FLEETSCOPE_DASHBOARD_AUTH", "doc": "how dashboard users sign in: token (a Fleetscope API token) or oidc (Streamlit's st.login, `[auth]` in secrets.toml)", "default": "token"})
    dashboard_oidc_scopes: str = field(metadata={"env": "FLEETSCOPE_DASHBOARD_OIDC_SCOPES", "doc": "with oidc: who gets which scopes, e.g. alice@x.org=admin;*@x.org=read;group:sre=read,admin", "default": ""})
    # API request limits (README "Scopes, bindings and limits")
    max_header_bytes: int = field(default=16384, metadata={"env": "FLEETSCOPE_MAX_HEADER_BYTES", "doc": "largest request head (request line and headers) the API reads; 431 above", "default": "16384"})
    read_header_timeout_s: float = field(default=10.0, metadata={"env": "FLEETSCOPE_READ_HEADER_TIMEOUT_S", "doc": "how long `fleetscope serve` waits for a request's head, from a connection's opening or a request's first byte; 408 and closed past it (0: no limit)", "default": "10"})
    read_body_timeout_s: float = field(default=60.0, metadata={"env": "FLEETSCOPE_READ_BODY_TIMEOUT_S", "doc": "how long `fleetscope serve` waits for a request's whole body once its head is read; 408 and closed past it, nothing of it stored (0: no limit)", "default": "60"})
    max_json_depth: int = field(default=64, metadata={"env": "FLEETSCOPE_MAX_JSON_DEPTH", "doc": "deepest nesting of arrays and objects a JSON body may have (400 above)", "default": "64"})
    max_future_skew_s: float = field(default=300.0, metadata={"env": "FLEETSCOPE_MAX_FUTURE_SKEW_S", "doc": "how far past the server's clock a pushed timestamp may lie (the whole push is refused with 422 beyond)", "default": "300"})
    token_rate_per_s: float = field(default=1000.0, metadata={"env": "FLEETSCOPE_TOKEN_RATE_PER_S", "doc": "requests per second one token may make to one API process, on average (429 + Retry-After above; 0: no limit)", "default": "1000"})
    token_burst: int = field(default=4096, metadata={"env": "FLEETSCOPE_TOKEN_BURST", "doc": "requests one token may make at once before its rate applies", "default": "4096"})
    auth_fail_rate_per_s: float = field(default=1.0, metadata={"env": "FLEETSCOPE_AUTH_FAIL_RATE_PER_S", "doc": "refused tokens per second one client address may present to one API process, on average (429 above; 0: no limit)", "default": "1"})
    auth_fail_burst: int = field(default=20, metadata={"env": "FLEETSCOPE_AUTH_FAIL_BURST", "doc": "refused tokens one client address may present at once before that rate applies", "default": "20"})
    # Scaling out (README "Scaling out")
    read_database_url: str = field(default="", metadata={"env": "FLEETSCOPE_READ_DATABASE_URL", "doc": "SQLAlchemy URL of a PostgreSQL streaming replica of FLEETSCOPE_DATABASE_URL that the dashboard and the read API query; writes stay on the primary; empty: everything on the primary", "default": ""})
    beat_lease_s: float = field(default=30.0, metadata={"env": "FLEETSCOPE_BEAT_LEASE_S", "doc": "beat's leader lease: of several `fleetscope beat`, the holder sends the schedule and renews every third of this; another takes over within this (and a third) after it dies", "default": "30"})

    @property
    def is_sqlite(self) -> bool:
        return self.database_url.startswith("sqlite")


def default_api_workers(database_url: str, cpus: int | None) -> int:
    """API processes by default: two on PostgreSQL where there are two CPUs to run them, one on SQLite, whose
    writers take turns across processes (benchmarks/ingest_agents.py --workers: on 2 cores shared with the
    database and the load, PostgreSQL took 1-30 % more agents' pushes a second with two, and a fleet's first
    round, every node new, 25-40 % more with its p99 from 130-175 ms to 25-35 ms; SQLite took none more)."""
    return 2 if database_url.startswith("postgresql") and (cpus or 1) >= 2 else 1


def api_workers(database_url: str) -> int:
    """The API processes ``fleetscope serve`` runs over ``database_url`` without --workers: FLEETSCOPE_API_WORKERS,
    else ``default_api_workers`` on this machine's CPUs."""
    return _positive("FLEETSCOPE_API_WORKERS", default_api_workers(database_url, os.cpu_count()))


def load() -> Settings:
    """Read the environment now. Call again after changing ``os.environ`` (tests do)."""
    data_dir = Path(env("FLEETSCOPE_DATA_DIR", "./.fleetscope")).expanduser().resolve()
    database_url = env("FLEETSCOPE_DATABASE_URL", f"sqlite:///{data_dir / 'fleetscope.store.db'}")
    broker_url = env("FLEETSCOPE_BROKER_URL", f"sqla+sqlite:///{data_dir / 'broker.db'}")
    default_backend = broker_url if broker_url.startswith(("redis://", "rediss://")) else f"db+sqlite:///{data_dir / 'results.db'}"
    host = env("FLEETSCOPE_API_HOST", "127.0.0.1")
    port = _int("FLEETSCOPE_API_PORT", 8000)
    otel = env("FLEETSCOPE_OTEL_EXPORTER", "none").lower()
    if otel not in ("none", "console", "otlp"):
        raise ValueError(f"FLEETSCOPE_OTEL_EXPORTER={otel!r}: expected none, console or otlp")
    dashboard_auth = env("FLEETSCOPE_DASHBOARD_AUTH", "token").lower()
    if dashboard_auth not in ("token", "oidc"):
        raise ValueError(f"FLEETSCOPE_DASHBOARD_AUTH={dashboard_auth!r}: expected token or oidc")
    retention_days = _positive("FLEETSCOPE_RETENTION_DAYS", 400)
    evidence_days = _positive("FLEETSCOPE_EVIDENCE_RETENTION_DAYS", 1095)
    if evidence_days < retention_days:
        # a finding or roll-up must outlive the samples it came from, or an audit reads conclusions with no trail
        raise ValueError(f"FLEETSCOPE_EVIDENCE_RETENTION_DAYS={evidence_days} is shorter than FLEETSCOPE_RETENTION_DAYS={retention_days}: "
                         "keep what the analyses derived at least as long as the raw telemetry")
    # A month and a bit: past that the minute tier only speeds up ranges of hours to days in past periods, which
    # the hour tier serves at a panel's 48 points; kept as long as raw it would be half the disk (README "Capacity model").
    minute_days = _positive("FLEETSCOPE_MINUTE_TIER_RETENTION_DAYS", 35)
    hour_days = _positive("FLEETSCOPE_HOUR_TIER_RETENTION_DAYS", 1095)
    if hour_days < minute_days:
        # reads past the minute tier's reach fall back to the hour tier, which must then still hold them
        raise ValueError(f"FLEETSCOPE_HOUR_TIER_RETENTION_DAYS={hour_days} is shorter than FLEETSCOPE_MINUTE_TIER_RETENTION_DAYS={minute_days}: "
                         "keep the coarser tier at least as long as the finer one")
    read_url = env("FLEETSCOPE_READ_DATABASE_URL", "")
    if read_url and not (read_url.startswith("postgresql") and database_url.startswith("postgresql")):
        raise ValueError(f"FLEETSCOPE_READ_DATABASE_URL={read_url.split('@')[-1]!r}: a read replica is a PostgreSQL streaming replica "
                         "of a PostgreSQL FLEETSCOPE_DATABASE_URL (postgresql+psycopg://...)")
    beat_lease_s = _float("FLEETSCOPE_BEAT_LEASE_S", 30.0)
    if beat_lease_s < 1:
        raise ValueError(f"FLEETSCOPE_BEAT_LEASE_S={beat_lease_s}: expected at least 1 second (the leader renews every third of it)")
    return Settings(
        data_dir=data_dir,
        database_url=database_url,
        broker_url=broker_url,
        result_backend=env("FLEETSCOPE_RESULT_BACKEND", default_backend),
        api_host=host,
        api_port=port,
        api_url=env("FLEETSCOPE_API_URL", f"http://{host}:{port}"),
        api_workers=api_workers(database_url),
        max_body_bytes=_int("FLEETSCOPE_MAX_BODY_BYTES", 256 * 2**20),
        group_commit_ms=_float("FLEETSCOPE_GROUP_COMMIT_MS", 2.0),
        ingest_max_pending=_int("FLEETSCOPE_INGEST_MAX_PENDING", 1024),
        ingest_max_pending_mb=_int("FLEETSCOPE_INGEST_MAX_PENDING_MB", 512),
        ingest_writers=_int("FLEETSCOPE_INGEST_WRITERS", 2),
        tune_allocator=_bool("FLEETSCOPE_TUNE_ALLOCATOR", True),
        auto_migrate=_bool("FLEETSCOPE_AUTO_MIGRATE", database_url.startswith("sqlite")),
        retention_days=retention_days,
        evidence_retention_days=evidence_days,
        minute_tier_retention_days=minute_days,
        hour_tier_retention_days=hour_days,
        hang_min_stall_s=_float("FLEETSCOPE_HANG_MIN_STALL_S", 300.0),
        sweep_shards=_positive("FLEETSCOPE_SWEEP_SHARDS", 1),
        idle_allocation_min_s=_float("FLEETSCOPE_IDLE_ALLOCATION_MIN_S", 1800.0),
        otel_exporter=otel,
        otel_endpoint=env("FLEETSCOPE_OTEL_ENDPOINT", "http://127.0.0.1:4318/v1/traces"),
        report_schedule=env("FLEETSCOPE_REPORT_SCHEDULE", "0 6 * * 1"),
        signing_key=env("FLEETSCOPE_SIGNING_KEY", ""),
        audit_key_file=env("FLEETSCOPE_AUDIT_KEY_FILE", ""),
        audit_checkpoint_file=env("FLEETSCOPE_AUDIT_CHECKPOINT_FILE", ""),
        log_level=env("FLEETSCOPE_LOG_LEVEL", "INFO").upper(),
        tls_cert=env("FLEETSCOPE_TLS_CERT", ""),
        tls_key=env("FLEETSCOPE_TLS_KEY", ""),
        dashboard_auth=dashboard_auth,
        dashboard_oidc_scopes=env("FLEETSCOPE_DASHBOARD_OIDC_SCOPES", ""),
        max_header_bytes=_positive("FLEETSCOPE_MAX_HEADER_BYTES", 16384),
        read_header_timeout_s=_float("FLEETSCOPE_READ_HEADER_TIMEOUT_S", 10.0),
        read_body_timeout_s=_float("FLEETSCOPE_READ_BODY_TIMEOUT_S", 60.0),
        max_json_depth=_positive("FLEETSCOPE_MAX_JSON_DEPTH", 64),
        max_future_skew_s=_float("FLEETSCOPE_MAX_FUTURE_SKEW_S", 300.0),
        token_rate_per_s=_float("FLEETSCOPE_TOKEN_RATE_PER_S", 1000.0),
        token_burst=_positive("FLEETSCOPE_TOKEN_BURST", 4096),
        auth_fail_rate_per_s=_float("FLEETSCOPE_AUTH_FAIL_RATE_PER_S", 1.0),
        auth_fail_burst=_positive("FLEETSCOPE_AUTH_FAIL_BURST", 20),
        read_database_url=read_url,
        beat_lease_s=beat_lease_s,
    )


def table() -> list[tuple[str, str, str]]:
    """(variable, default, meaning) for every setting: the README's configuration table comes from here."""
    return [(f.metadata["env"], f.metadata["default"], f.metadata["doc"]) for f in fields(Settings)]
