"""SQLAlchemy tables for the canonical frames, generated from ``fleetscope.core.frames``.

A frame's natural key becomes the table's primary key, so writing the same data twice keeps one copy
(docs/ARCHITECTURE.md: natural keys, not surrogate ones, decide what is a duplicate). Indexes serve the reads the
analyzers and the dashboard make: by time, by job, by GPU, by host.

Timestamps are ``timestamptz`` on PostgreSQL and int64 microseconds since the Unix epoch on SQLite:
SQLite has no datetime type, and integers keep its index comparisons and bulk writes cheap.
"""

from __future__ import annotations


from sqlalchemy import (
    BigInteger,
    Column,
    Double,
    Index,
    Integer,
    String,
    Table,
    Text,
    UniqueConstraint,
    func,
)

from fleetscope.core import frames as F
from fleetscope.store import alerting_schema as _alerting_schema  # noqa: F401  (alerting tables on the same metadata)
from governance.aiact.frames import AIACT_FRAMES
from governance.frames import GOVERNANCE_FRAMES

from fleetscope.store.sqltypes import EPOCH, NAMING_CONVENTION, UTCDateTime, _columns, _frame_table, byte_ordered_strings, metadata, sql_type  # noqa: F401


site = _frame_table(F.SITE)
host = _frame_table(F.HOST, Index(None, "site_id"))
gpu = _frame_table(F.GPU, Index(None, "host"))
job = _frame_table(F.JOB, Index(None, "started_at"), Index(None, "model_name"))
job_rank = _frame_table(F.JOB_RANK, Index(None, "gpu_uuid", "start"))
# The key (gpu_uuid, ts) serves "these GPUs over this window"; the ts index serves fleet-wide windows
# and retention. Both were measured in benchmarks/store_write.py against the write target.
gpu_sample = _frame_table(F.GPU_SAMPLE, Index(None, "ts"), key_order=("gpu_uuid", "ts"))
gpu_workload = _frame_table(F.GPU_WORKLOAD, Index(None, "namespace", "pod"), key_order=("gpu_uuid", "ts"))
collective = _frame_table(F.COLLECTIVE, Index(None, "job_id", "start"))
step = _frame_table(F.STEP, Index(None, "job_id", "start"))
# keyed (job_id, rank, start, window): a job's rows are one key range; the start index serves retention
device_union = _frame_table(F.DEVICE_UNION, Index(None, "start"))
job_op = _frame_table(F.JOB_OP, Index(None, "ts"))
job_event = _frame_table(F.JOB_EVENT, Index(None, "ts"), Index(None, "kind", "ts"))
health_event = _frame_table(
    F.HEALTH_EVENT, Index(None, "host", "ts"), Index(None, "kind", "ts"), key_order=("gpu_uuid", "ts", "host", "kind", "code")
)
nccl_test = _frame_table(F.NCCL_TEST, Index(None, "ts"))
# Port samples are read per port over a window and fleet-wide by time.
fabric_port_sample = _frame_table(F.FABRIC_PORT_SAMPLE, Index(None, "ts"), key_order=("node", "device", "port", "ts"))
fabric_link = _frame_table(F.FABRIC_LINK, Index(None, "b_node", "b_port"), Index(None, "a_host"))
fabric_gpu_nic = _frame_table(F.FABRIC_GPU_NIC)
# Serving (fleetscope/core/serving_frames.py): a deployment's series are read over a window, and
# fleet-wide windows and retention go by time.
from fleetscope.core import serving_frames as SF  # noqa: E402

serving_replica = _frame_table(SF.SERVING_REPLICA, Index(None, "namespace", "pod"), Index(None, "host"))
serving_bucket = _frame_table(SF.SERVING_BUCKET, Index(None, "ts"), key_order=("deployment", "metric", "ts", "replica", "model", "version", "labels", "le"))
serving_counter = _frame_table(SF.SERVING_COUNTER, Index(None, "ts"), key_order=("deployment", "metric", "ts", "replica", "model", "version", "labels"))
serving_gauge = _frame_table(SF.SERVING_GAUGE, Index(None, "ts"), key_order=("deployment", "metric", "ts", "replica", "model", "version", "labels"))
serving_request = _frame_table(SF.SERVING_REQUEST, Index(None, "deployment", "arrival"), Index(None, "arrival"))
serving_slo = _frame_table(SF.SERVING_SLO)
# Scheduler (fleetscope/core/scheduler_frames.py): jobs are read by period (start, end) and by account.
from fleetscope.core import scheduler_frames as SCH  # noqa: E402

sched_account = _frame_table(SCH.SCHED_ACCOUNT)
sched_partition = _frame_table(SCH.SCHED_PARTITION)
sched_node = _frame_table(SCH.SCHED_NODE)
sched_job = _frame_table(SCH.SCHED_JOB, Index(None, "start_at"), Index(None, "end_at"), Index(None, "account"))
sched_job_node = _frame_table(SCH.SCHED_JOB_NODE, Index(None, "host"))
sched_step = _frame_table(SCH.SCHED_STEP)
team_mapping = _frame_table(SCH.TEAM_MAPPING)
team_budget = _frame_table(SCH.TEAM_BUDGET)
# Kept out of FRAMES, like energy_instrument: recorded through its service, with who and when, never pushed.
price_book = _frame_table(SF.PRICE_BOOK)
step_breakdown = _frame_table(F.STEP_BREAKDOWN, Index(None, "job_id", "start"))
job_analysis = _frame_table(F.JOB_ANALYSIS, Index(None, "computed_at"))
# Keyed (minute, gpu_uuid) for fleet-wide windows; the (gpu_uuid, minute) index serves a job's GPUs.
gpu_energy_minute = _frame_table(F.GPU_ENERGY_MINUTE, Index(None, "gpu_uuid", "minute"))

# metric_sample is the one frame stored differently from its shape: each distinct series key is kept once
# in `series`, and samples point at it by integer id (the key string can be hundreds of bytes).
series = Table(
    "series",
    metadata,
    Column("series_id", Integer, primary_key=True, autoincrement=True),
    Column("series", Text, nullable=False, unique=True, comment='name{label="value",...}, labels sorted'),
    Column("name", Text, nullable=False),
    Index(None, "name"),
)
metric_sample = Table(
    "metric_sample",
    metadata,
    # No foreign key to `series`: checked row by row it was the largest part of PostgreSQL's work a scrape, and the
    # store, the one writer of both, takes every id from `series` in the sample's transaction (migration 0022).
    Column("series_id", Integer, primary_key=True),
    Column("ts", UTCDateTime(), primary_key=True),
    Column("value", Double, nullable=False),
    Index(None, "ts"),
    comment=F.METRIC_SAMPLE.doc,
)

# Findings carry a surrogate id too, so alerts and evidence can point at one; the natural key stays unique.
finding = Table(
    "finding",
    metadata,
    Column("finding_id", Integer, primary_key=True, autoincrement=True),
    *[Column(c.name, sql_type(c.dtype), nullable=c.nullable and not c.key, comment=c.doc or None) for c in F.FINDING.columns],
    Column("created_at", UTCDateTime(), nullable=False, server_default=func.current_timestamp()),
    UniqueConstraint(*F.FINDING.key),
    Index(None, "kind", "window_start"),
    Index(None, "subject"),
    comment=F.FINDING.doc,
)

api_token = Table(
    "api_token",
    metadata,
    Column("token_id", Integer, primary_key=True, autoincrement=True),
    Column("name", String(200), nullable=False),
    Column("token_sha256", String(64), nullable=False, unique=True, comment="hex SHA-256 of the secret; the secret is never stored"),
    Column("scopes", String(200), nullable=False, comment="space-separated: ingest read governance admin"),
    Column("created_at", UTCDateTime(), nullable=False),
    Column("expires_at", UTCDateTime(), nullable=True),
    Column("revoked_at", UTCDateTime(), nullable=True),
    Column("last_used_at", UTCDateTime(), nullable=True),
    Column("bound_site", String(200), nullable=True, comment="pushes may name only this site (null: any)"),
    Column("bound_host", String(500), nullable=True, comment="pushes may name only this host (null: any)"),
    Column("bound_source", String(2000), nullable=True, comment="pushes must claim this source (null: any)"),
)

ingest_log = Table(
    "ingest_log",
    metadata,
    Column("ingest_id", Integer, primary_key=True, autoincrement=True),
    Column("at", UTCDateTime(), nullable=False),
    Column("source", Text, nullable=False),
    Column("content_sha256", String(64), nullable=True),
    Column("rows_json", Text, nullable=False, comment="rows written per frame"),
    Column("values", BigInteger, nullable=False),
    Index(None, "at"),
    Index(None, "content_sha256"),
)

task_run = Table(
    "task_run",
    metadata,
    Column("task_run_id", Integer, primary_key=True, autoincrement=True),
    Column("task", String(200), nullable=False),
    Column("task_id", String(64), nullable=True),
    Column("state", String(20), nullable=False, comment="success, failure or retry"),
    Column("at", UTCDateTime(), nullable=False),
    Column("runtime_s", Double, nullable=True),
    Column("detail", Text, nullable=True),
    Index(None, "task", "at"),
    comment="Outcome of each Celery task run, so /metrics and the dashboard see the workers' work.",
)

# Governance records are declared beside their pure code (governance/frames.py) and stored like the
# canonical frames: one table per spec, natural key as primary key.

for _spec in GOVERNANCE_FRAMES.values():
    _frame_table(_spec)
_AIACT_INDEXES = {
    "aiact_declaration": (Index(None, "model_name", "model_version", "kind"),),
    "aiact_rule_result": (Index(None, "model_name", "as_of"),),
}
for _spec in AIACT_FRAMES.values():
    _frame_table(_spec, *_AIACT_INDEXES.get(_spec.name, ()))
# Post-market monitoring (fleetscope/core/monitoring_frames.py): a window reads one model's predictions by time.
from fleetscope.core.monitoring_frames import MODEL_OUTCOME, MODEL_PREDICTION, MONITORING_FRAMES, MONITORING_WINDOW  # noqa: E402

_frame_table(MODEL_PREDICTION, Index(None, "model_name", "model_version", "ts"))
_frame_table(MODEL_OUTCOME)
_frame_table(MONITORING_WINDOW)

energy_instrument = _frame_table(F.ENERGY_INSTRUMENT, Index(None, "site_id", "start"))
# Keyed (minute, site_id); a site's window reads the (site_id, minute) index.
site_energy_minute = _frame_table(F.SITE_ENERGY_MINUTE, Index(None, "site_id", "minute"))
# Keyed (minute, job_id, site_id); a job's period reads the (job_id, minute) index.
job_energy_minute = _frame_table(F.JOB_ENERGY_MINUTE, Index(None, "job_id", "minute"))

# Roll-up tiers of gpu_sample (fleetscope/core/tier_frames.py): keyed like gpu_sample, (gpu_uuid, bucket), for one
# GPU's range; the bucket index serves fleet-wide probes and retention.
from fleetscope.core.tier_frames import JOB_USAGE_HOUR, TIER_FRAMES  # noqa: E402

for _spec in TIER_FRAMES.values():
    _frame_table(_spec, Index(None, "bucket"), key_order=("gpu_uuid", "bucket"))
# Keyed (cluster, job_id, bucket) for one job's re-roll; a period's costs read the bucket index.
job_usage_hour = _frame_table(JOB_USAGE_HOUR, Index(None, "bucket"), key_order=("cluster", "job_id", "bucket"))
gpu_sample_minute, gpu_sample_hour = metadata.tables["gpu_sample_minute"], metadata.tables["gpu_sample_hour"]

# How far each roll-up tier has been rolled: the tier task advances from here, never re-reading a closed window.
rollup_watermark = Table(
    "rollup_watermark",
    metadata,
    Column("tier", String(40), primary_key=True, comment="minute, hour, or job_hour (services/job_usage.py)"),
    Column("rolled_to", UTCDateTime(), nullable=False, comment="every bucket before this instant is rolled"),
    Column("rolled_at", UTCDateTime(), nullable=False, comment="when it last advanced"),
    comment="Watermarks of the gpu_sample roll-up tiers (services/tiers.py).",
)

# Beat's leader lease (services/leader.py): beat runs twice or more for availability, and only the holder of an
# unexpired lease sends the schedule; another takes the row over once the holder stops renewing it.
beat_lease = Table(
    "beat_lease",
    metadata,
    Column("name", String(40), primary_key=True, comment="the schedule the lease is for"),
    Column("holder", String(200), nullable=False, comment="host:pid:nonce of the beat that holds it"),
    Column("expires_at", UTCDateTime(), nullable=False, comment="the holder leads until this instant unless it renews"),
    Column("acquired_at", UTCDateTime(), nullable=False, comment="when this holder took the lease"),
    comment="Leader lease of beat's schedule: one row per schedule, held by one beat at a time.",
)

# When each of beat's schedule entries was last sent, shared by every beat: a beat that takes the lease over goes on
# from here, so a run the old leader sent is not sent again and one it missed is sent once.
beat_entry = Table(
    "beat_entry",
    metadata,
    Column("name", String(200), primary_key=True, comment="the beat_schedule entry"),
    Column("last_run_at", UTCDateTime(), nullable=False),
    Column("total_run_count", BigInteger, nullable=False),
    comment="Last send of each beat schedule entry, written by the leading beat.",
)

# The last reading of each GPU's DCGM fault counters, shared by every process that writes (Store.write): only a
# changed reading is a new health event. ``version`` orders the changes, so a process's cache reloads only
# the rows changed since it last looked.
counter_reading = Table(
    "counter_reading",
    metadata,
    Column("gpu_uuid", Text, primary_key=True),
    Column("code", BigInteger, primary_key=True, comment="DCGM field id of the counter"),
    Column("value", Double, nullable=True, comment="the newest reading"),
    Column("version", BigInteger, nullable=False, comment="the change that wrote this reading, increasing"),
    Index(None, "version"),
    comment="Last reading of each GPU's DCGM fault counters, shared by the writing processes.",
)

# The gpu table's change counter on SQLite, advanced by a trigger for every row inserted, updated or deleted
# (migration 0020), so a process can tell that an inventory it found stored is still what the table holds
# (store/inventory.py). PostgreSQL counts with the sequence gpu_inventory_version instead: nextval takes no
# row lock for concurrent writers to queue on.
inventory_version = Table(
    "inventory_version",
    metadata,
    Column("name", String(40), primary_key=True, comment="the inventory table counted: gpu"),
    Column("version", BigInteger, nullable=False, comment="rows of it changed since the count began"),
    comment="Change counter of the gpu inventory (SQLite; PostgreSQL: the sequence gpu_inventory_version).",
)

# What an incremental job analysis has folded so far (services/job_fold.py): the step-based analyses' mergeable
# state and the watermarks a run reads on from, one row per job and analysis state.
job_analysis_state = Table(
    "job_analysis_state",
    metadata,
    Column("job_id", Text, primary_key=True),
    Column("analyzer", String(40), primary_key=True, comment="whose state: steps (C3, stragglers, program goodput)"),
    Column("state", Text, nullable=False, comment="JSON: watermarks and the folded partial results"),
    Column("updated_at", UTCDateTime(), nullable=False, comment="the analysis time of the run that wrote it"),
    comment="Folded partial results of incremental job analyses (services/job_fold.py).",
)

# Last, once every table is on the metadata: string columns compare by bytes on PostgreSQL (migration 0024).
byte_ordered_strings(metadata)

# Every frame the store can write and read, by name.
FRAME_SPECS: dict[str, F.FrameSpec] = {**F.FRAMES, **F.ENERGY_FRAMES, **GOVERNANCE_FRAMES, **AIACT_FRAMES, **MONITORING_FRAMES,
                                       SF.PRICE_BOOK.name: SF.PRICE_BOOK, SCH.TEAM_BUDGET.name: SCH.TEAM_BUDGET, **TIER_FRAMES,
                                       JOB_USAGE_HOUR.name: JOB_USAGE_HOUR}
FRAME_TABLES: dict[str, Table] = {name: metadata.tables[name] for name in FRAME_SPECS}

# The time column each frame is windowed by, for reads and retention.
TIME_COLUMN: dict[str, str] = {
    "site": "",
    "host": "",
    "gpu": "",
    "job": "started_at",
    "job_rank": "start",
    "gpu_sample": "ts",
    "gpu_workload": "ts",
    "metric_sample": "ts",
    "collective": "start",
    "step": "start",
    "device_union": "start",
    "job_op": "ts",
    "job_event": "ts",
    "health_event": "ts",
    "nccl_test": "ts",
    "fabric_port_sample": "ts",
    "fabric_link": "",
    "fabric_gpu_nic": "",
    "serving_replica": "",
    "serving_bucket": "ts",
    "serving_counter": "ts",
    "serving_gauge": "ts",
    "serving_request": "arrival",
    "serving_slo": "",
    "sched_account": "",
    "sched_partition": "",
    "sched_node": "",
    "sched_job": "start_at",
    "sched_job_node": "",
    "sched_step": "observed_at",
    "team_mapping": "",
    "team_budget": "",
    "price_book": "valid_from",
    "step_breakdown": "start",
    "job_analysis": "computed_at",
    "gpu_energy_minute": "minute",
    "site_energy_minute": "minute",
    "job_energy_minute": "minute",
    "finding": "window_start",
    "model_prediction": "ts",
    "model_outcome": "ts",
    "monitoring_window": "window_start",
    "gpu_sample_minute": "bucket",
    "gpu_sample_hour": "bucket",
    "job_usage_hour": "bucket",
}
