"""Scheduler tables: what a batch scheduler (Slurm) or an orchestrator (Kubernetes) records about jobs,
the nodes they ran on and the accounts they were charged to, and the mapping of those accounts to teams.

Declared in the core floor so the parsers (``ingest/slurm_sacct.py``, ``ingest/slurm_squeue.py``,
``ingest/slurm_scontrol.py``, ``ingest/slurmrestd.py``, ``ingest/kube_state.py``) and the pure analyses
(``analyzers/scheduler.py``) share them; ``fleetscope.core.frames`` puts them in ``FRAMES`` and
``fleetscope/store/schema.py`` makes their tables (migration 0015).

Identity. A job is (``cluster``, ``job_id``): Slurm's job id as it prints it (``8150389``, an array task
``5908801_3``), a Kubernetes pod as ``namespace/pod``. ``cluster`` is Slurm's ``ClusterName`` where the data
carries it (slurmrestd, ``sacct --json``) and empty where it does not (``sacct -P`` text). Rows are
``update``: a later snapshot wins field by field (``COALESCE``), so a ``squeue`` line that knows only the
pending reason does not erase what ``sacct`` said about the job.

Units: times UTC; durations in seconds; GPUs as whole devices (a MIG slice counts as one, as Slurm's
``gres/gpu`` does). ``gpus`` is null when the source does not say (older accounting without ``gres/gpu`` in
AccountingStorageTRES), never a guessed zero.
"""

from __future__ import annotations

import polars as pl

from fleetscope.core.spec import UTC_US, FrameSpec, _f, _k, _r, conform


SCHED_JOB = FrameSpec(
    "sched_job",
    (
        _k("cluster", pl.String, default="", doc="Slurm ClusterName, Kubernetes cluster; empty when the source does not say"),
        _k("job_id", pl.String, doc="Slurm job id (array task 123_4), or namespace/pod"),
        _f("scheduler", pl.String, doc="slurm or kubernetes"),
        _f("name", pl.String),
        _f("user", pl.String),
        _f("account", pl.String, doc="Slurm account; Kubernetes namespace"),
        _f("partition", pl.String),
        _f("qos", pl.String),
        _f("state", pl.String, doc="base state: PENDING, RUNNING, COMPLETED, FAILED, CANCELLED, TIMEOUT, NODE_FAIL, PREEMPTED, OUT_OF_MEMORY, ..."),
        _f("state_reason", pl.String, doc="why pending or why ended (Slurm state_reason: Resources, Priority, BeginTime, NonZeroExitCode, TimeLimit)"),
        _f("cancelled_by", pl.String, doc="uid or user that cancelled it (sacct 'CANCELLED by N')"),
        _f("exit_code", pl.Int64, doc="the job's return code"),
        _f("exit_signal", pl.Int64),
        _f("dependency", pl.String, doc="squeue %E: afterany:123(unfulfilled)"),
        _f("submit_at", UTC_US),
        _f("eligible_at", UTC_US, doc="when it could first start (a begin time or dependency delays it past submit)"),
        _f("start_at", UTC_US),
        _f("end_at", UTC_US),
        _f("time_limit_s", pl.Int64),
        _f("elapsed_s", pl.Int64),
        _f("gpus", pl.Int64, doc="GPUs allocated (or requested while pending); null: the source does not say"),
        _f("gpu_types", pl.String, doc="by type, sorted: a100:2,v100:1"),
        _f("gpu_source", pl.String, doc="where the count came from: tres_alloc, gres_detail, tres_per_job, tres_per_node, tres_req, k8s_request"),
        _f("cpus", pl.Int64),
        _f("node_count", pl.Int64),
        _f("nodes", pl.String, doc="the node list as Slurm writes it (node[01-04,07]); sched_job_node has it expanded"),
        _f("array_job_id", pl.String),
        _f("controller", pl.String, doc="Kubernetes owner: Job/name, PyTorchJob/name, JobSet/name"),
        _f("labels", pl.String, doc="Kubernetes pod labels as a JSON object"),
        _f("observed_at", UTC_US, doc="when the snapshot that last updated the row was taken"),
        _f("source", pl.String),
    ),
    on_conflict="update",
    doc="A scheduler job (Slurm) or pod (Kubernetes): who, where, when, its state and the GPUs it held.",
)

SCHED_JOB_NODE = FrameSpec(
    "sched_job_node",
    (
        _k("cluster", pl.String, default=""),
        _k("job_id", pl.String),
        _k("host", pl.String, doc="one node of the job's expanded node list"),
        _f("gpus", pl.Int64, doc="GPUs the job holds on this node (null: not known per node)"),
        _f("gpu_types", pl.String),
        _f("gpu_indices", pl.String, doc="device indices on the node (gres_detail IDX), comma-separated: joins gpu (host, gpu_index)"),
        _f("source", pl.String),
    ),
    on_conflict="update",
    doc="Which nodes (and which GPUs on them) a scheduler job holds.",
)

SCHED_STEP = FrameSpec(
    "sched_step",
    (
        _k("cluster", pl.String, default=""),
        _k("job_id", pl.String),
        _k("step", pl.String, doc="batch, extern, 0, 1, ..."),
        _k("observed_at", UTC_US, doc="step end (sacct) or the sstat sample time"),
        _f("state", pl.String),
        _f("host", pl.String),
        _f("elapsed_s", pl.Int64),
        _f("gpu_util_ratio", doc="TRESUsageInTot gres/gpuutil / 100 (Slurm's acct_gather_gpu average)"),
        _f("gpu_util_max_ratio", doc="TRESUsageInMax gres/gpuutil / 100"),
        _f("gpu_mem_bytes", pl.Int64, doc="TRESUsageInTot gres/gpumem"),
        _f("max_rss_bytes", pl.Int64),
        _f("cpu_s", doc="TRESUsageInTot cpu"),
        _f("source", pl.String),
    ),
    on_conflict="update",
    doc="A job step's resource use as sacct or sstat reports it (GPU utilisation where the cluster gathers it).",
)

SCHED_NODE = FrameSpec(
    "sched_node",
    (
        _k("cluster", pl.String, default=""),
        _k("host", pl.String),
        _f("state", pl.String, doc="Slurm node state and flags joined by '+': IDLE+DRAIN, MIXED"),
        _f("reason", pl.String, doc="drain or down reason"),
        _f("reason_set_by", pl.String),
        _f("reason_changed_at", UTC_US),
        _f("gpus_total", pl.Int64),
        _f("gpus_alloc", pl.Int64),
        _f("gpu_types", pl.String),
        _f("cpus_total", pl.Int64),
        _f("cpus_alloc", pl.Int64),
        _f("partitions", pl.String, doc="comma-separated"),
        _f("observed_at", UTC_US),
        _f("source", pl.String),
    ),
    on_conflict="update",
    doc="A scheduler node: its state, drain reason and GPUs configured and allocated.",
)

SCHED_PARTITION = FrameSpec(
    "sched_partition",
    (
        _k("cluster", pl.String, default=""),
        _k("partition", pl.String),
        _f("nodes", pl.String, doc="configured node list"),
        _f("node_count", pl.Int64),
        _f("gpus_total", pl.Int64, doc="gres/gpu of the configured TRES"),
        _f("cpus_total", pl.Int64),
        _f("priority_tier", pl.Int64),
        _f("state", pl.String),
        _f("observed_at", UTC_US),
        _f("source", pl.String),
    ),
    on_conflict="update",
    doc="A Slurm partition: its nodes and configured GPUs.",
)

SCHED_ACCOUNT = FrameSpec(
    "sched_account",
    (
        _k("cluster", pl.String, default=""),
        _k("account", pl.String),
        _f("organization", pl.String, doc="slurmdbd account organization: the account's parent group"),
        _f("description", pl.String),
        _f("source", pl.String),
    ),
    on_conflict="update",
    doc="A Slurm accounting account and the organization it belongs to.",
)

TEAM_MAPPING = FrameSpec(
    "team_mapping",
    (
        _k("kind", pl.String, doc="slurm_account, slurm_organization, k8s_namespace or k8s_label"),
        _k("match", pl.String, doc="the account, organization or namespace; for a label key=value"),
        _k("cluster", pl.String, default="", doc="empty: every cluster"),
        _r("team", pl.String),
        _r("recorded_by", pl.String),
        _r("recorded_at", UTC_US),
    ),
    on_conflict="update",
    doc="Which team a Slurm account, organization, Kubernetes namespace or label belongs to (set through the API).",
)

TEAM_BUDGET = FrameSpec(
    "team_budget",
    (
        _k("team", pl.String),
        _k("month", pl.String, default="", doc="YYYY-MM it holds for; empty: every month without its own row"),
        _f("gpu_hour_quota", doc="GPU-hours allocated the team may use in the month (null: no quota)"),
        _f("budget", doc="money the team may spend in the month, in currency (null: no money budget)"),
        _f("currency", pl.String, doc="ISO 4217 code of budget, e.g. EUR"),
        _r("recorded_by", pl.String),
        _r("recorded_at", UTC_US),
    ),
    on_conflict="update",
    doc="A team's monthly GPU-hour quota and/or money budget (set through the API, recorded with who and when).",
)
"""Kept out of ``SCHEDULER_FRAMES`` (and so out of ``FRAMES``), like the price book: recorded through its
service with who and when, never pushed through the ingest door."""

SCHEDULER_FRAMES: tuple[FrameSpec, ...] = (SCHED_ACCOUNT, SCHED_PARTITION, SCHED_NODE, SCHED_JOB, SCHED_JOB_NODE, SCHED_STEP, TEAM_MAPPING)


def frame(spec: FrameSpec, rows: list[dict[str, object]]) -> pl.DataFrame:
    """Rows (dicts of the spec's columns, any subset) as a conformed frame; the empty frame for none."""
    if not rows:
        return spec.empty()
    return conform(spec, pl.DataFrame(rows, schema_overrides={k: v for k, v in spec.schema.items()}, infer_schema_length=None))


def fleet_job_id(cluster: str, job_id: str) -> str:
    """The fleet ``job`` row a scheduler job becomes: the scheduler's id, prefixed by its cluster when known."""
    return f"{cluster}/{job_id}" if cluster else job_id


def fleet_jobs(jobs: list[dict[str, object]]) -> list[dict[str, object]]:
    """``job`` inventory rows (fleetscope.core.frames.JOB) for scheduler job rows, so the fleet's other
    reads (energy, goodput, the job pages) know them: owner the user, world size the GPUs held."""
    out = []
    for j in jobs:
        if "." in str(j.get("job_id", "")):
            continue
        out.append({
            "job_id": fleet_job_id(str(j.get("cluster") or ""), str(j["job_id"])), "name": j.get("name"), "owner": j.get("user"),
            "submitted_at": j.get("submit_at"), "started_at": j.get("start_at"), "ended_at": j.get("end_at"),
            "status": (str(j["state"]).lower() if j.get("state") else None),
        })
    return out
