"""A Slurm-shaped and a Kubernetes-shaped cluster beside the simulated fleet, written in their real formats.

Slurm: ``sacct --parsable2`` with a header (``sacct -P -a -o JobID,Cluster,...``, sacct(1)), and slurmctld's
view at the end (``squeue --json``, the ``/slurm/v0.0.40/jobs`` answer, whose ``gres_detail`` ties each node's
GPUs to the telemetry by device index): the fleet's
training jobs under account ``llm``, and on a node no training job uses, team ``vision``'s evaluation job
preempted by a higher-priority one (state ``PREEMPTED``, ``ExitCode 0:15``) and then its notebook job, which
holds all eight GPUs and leaves them idle (the telemetry of unallocated GPUs reads 0 % utilisation); one job
pends for ``Resources``. Kubernetes: a kube-state-metrics ``/metrics`` body (docs/metrics/workload/
pod-metrics.md, node-metrics.md) of an ``inference`` namespace serving on two GPU nodes and a ``research``
PyTorchJob whose two pods finished. ``truth`` says what the scheduler and chargeback reads must find.

Pure: the fleet's hosts and jobs in, bytes and a dict out; nothing reads the clock.
"""

from __future__ import annotations

import datetime as dt
import json
import re
import uuid
from dataclasses import dataclass, field
from typing import Any

SLURM_CLUSTER = "sim-slurm"
GPU_TYPE = "h100"
K8S_NODES = ("k8s-gpu-01", "k8s-gpu-02")
SACCT_FIELDS = ("JobID", "Cluster", "JobName", "User", "Account", "Partition", "QOS", "State", "Reason", "ExitCode", "Submit",
                "Eligible", "Start", "End", "Elapsed", "Timelimit", "NNodes", "NCPUS", "NodeList", "ReqTRES", "AllocTRES")
TEAMS = (("slurm_account", "llm", "llm"), ("slurm_account", "vision", "vision"), ("k8s_namespace", "inference", "inference"),
         ("k8s_namespace", "research", "research"))


@dataclass(frozen=True)
class SlurmJob:
    job_id: str
    name: str
    user: str
    account: str
    state: str
    submit: dt.datetime
    start: dt.datetime | None
    end: dt.datetime | None
    hosts: tuple[str, ...]
    gpus: int
    partition: str = "gpu"
    qos: str = "normal"
    reason: str = "None"
    exit_code: str = "0:0"
    time_limit_s: int = 86_400

    def gpu_hours(self, until: dt.datetime) -> float:
        if self.start is None:
            return 0.0
        end = min(self.end or until, until)
        return self.gpus * max(0.0, end.timestamp() - self.start.timestamp()) / 3600


@dataclass(frozen=True)
class Pod:
    namespace: str
    name: str
    node: str
    gpus: int
    phase: str
    created: dt.datetime
    started: dt.datetime
    completed: dt.datetime | None
    owner_kind: str
    owner_name: str
    labels: dict[str, str] = field(default_factory=dict)

    def gpu_hours(self, until: dt.datetime) -> float:
        end = min(self.completed or until, until)
        return self.gpus * max(0.0, end.timestamp() - self.started.timestamp()) / 3600


@dataclass(frozen=True)
class SchedulerWorld:
    slurm: tuple[SlurmJob, ...]
    pods: tuple[Pod, ...]
    idle_job: SlurmJob
    preempted_job: SlurmJob
    end: dt.datetime  # the snapshot: when sacct ran and kube-state-metrics was scraped
    k8s_site: str

    def truth(self) -> dict[str, Any]:
        """What the scheduler reads must find: per-team GPU-hours to ``end``, the idle and preempted jobs."""
        per_team: dict[str, float] = {}
        teams = {(k, m): t for k, m, t in TEAMS}
        for j in self.slurm:
            t = teams[("slurm_account", j.account)]
            per_team[t] = per_team.get(t, 0.0) + j.gpu_hours(self.end)
        for p in self.pods:
            t = teams[("k8s_namespace", p.namespace)]
            per_team[t] = per_team.get(t, 0.0) + p.gpu_hours(self.end)
        return {
            "cluster": SLURM_CLUSTER, "end": self.end.isoformat(), "teams": [{"kind": k, "match": m, "team": t} for k, m, t in TEAMS],
            "team_gpu_hours": {t: round(h, 6) for t, h in sorted(per_team.items())},
            "idle": {"job_id": self.idle_job.job_id, "team": "vision", "host": self.idle_job.hosts[0], "gpus": self.idle_job.gpus,
                     "since": self.idle_job.start.isoformat() if self.idle_job.start else None},
            "preempted": {"job_id": self.preempted_job.job_id, "team": "vision", "state": "PREEMPTED"},
            "pending": [j.job_id for j in self.slurm if j.state == "PENDING"],
            "k8s_nodes": list(K8S_NODES), "k8s_site": self.k8s_site,
        }


def scheduler_world(start: dt.datetime, duration_s: float, hosts: list[str], host_site: list[str], gpus_per_node: int,
                    training: list[dict[str, Any]], avoid_hosts: tuple[str, ...] = ()) -> SchedulerWorld:
    """The two clusters over ``[start, start + duration_s]``. ``training`` are the simulator's jobs (``job_id``,
    ``name``, ``hosts``, ``world_size``, ``start``, ``end`` ISO or None), run under account ``llm`` with their own
    ids where those are numeric; the vision team's node is the last host
    no training job uses and not in ``avoid_hosts`` (a host that goes silent), else the last host."""
    end = start + dt.timedelta(seconds=duration_s)
    at = lambda s: start + dt.timedelta(seconds=s)  # noqa: E731
    used = {h for j in training for h in j["hosts"]}
    free = [h for h in hosts if h not in used and h not in avoid_hosts]
    node = free[-1] if free else hosts[-1]
    jobs: list[SlurmJob] = []
    for i, j in enumerate(training):
        # sacct prints whole seconds
        began = dt.datetime.fromisoformat(j["start"]).replace(microsecond=0)
        ended = dt.datetime.fromisoformat(j["end"]).replace(microsecond=0) if j.get("end") else None
        job_id = str(j["job_id"]) if str(j["job_id"]).isdigit() else str(4100 + i)  # the simulator's ids are Slurm-like already
        jobs.append(SlurmJob(job_id, j["name"], "u-llm", "llm", "COMPLETED" if ended else "RUNNING",
                             began - dt.timedelta(seconds=120 + 60 * i), began, ended, tuple(j["hosts"]), int(j["world_size"])))
    preempted_at = at(round(0.3 * duration_s))
    preempted = SlurmJob("4200", "eval-sweep", "u-vis", "vision", "PREEMPTED", at(0), at(20), preempted_at, (node,), gpus_per_node,
                         qos="low", exit_code="0:15")
    idle = SlurmJob("4201", "notebook", "u-vis", "vision", "RUNNING", preempted_at, preempted_at + dt.timedelta(seconds=30), None,
                    (node,), gpus_per_node)
    pending = SlurmJob("4202", "finetune", "u-llm", "llm", "PENDING", at(round(0.75 * duration_s)), None, None, (), 2 * gpus_per_node,
                       reason="Resources")
    jobs += [preempted, idle, pending]
    k8s_site = host_site[0]
    pods = [Pod("inference", f"vllm-llama-{k}", K8S_NODES[k // 2], 4, "Running", at(-3600), at(-3590), None, "ReplicaSet", "vllm-llama-6f9c7b",
                {"app": "vllm"}) for k in range(4)]
    pods += [Pod("research", f"bert-ft-{role}-0", K8S_NODES[k], 2, "Succeeded", at(0), at(10), at(round(0.5 * duration_s)), "PyTorchJob", "bert-ft",
                 {"training.kubeflow.org/job-name": "bert-ft", "training.kubeflow.org/replica-type": role})
             for k, role in enumerate(("master", "worker"))]
    return SchedulerWorld(tuple(jobs), tuple(pods), idle, preempted, end, k8s_site)


def hostlist(hosts: tuple[str, ...] | list[str]) -> str:
    """Slurm's compressed host list (``site-a-r01-n[000-001]``), the form sacct's NodeList prints."""
    groups: dict[tuple[str, int], list[int]] = {}
    plain: list[str] = []
    for h in hosts:
        m = re.fullmatch(r"(.*?)(\d+)", h)
        if m is None:
            plain.append(h)
        else:
            groups.setdefault((m.group(1), len(m.group(2))), []).append(int(m.group(2)))
    parts = list(plain)
    for (prefix, width), nums in groups.items():
        nums = sorted(set(nums))
        if len(nums) == 1:
            parts.append(f"{prefix}{nums[0]:0{width}d}")
            continue
        ranges, lo = [], nums[0]
        for a, b in zip(nums, nums[1:] + [None]):
            if b != a + 1:
                ranges.append(f"{lo:0{width}d}" if lo == a else f"{lo:0{width}d}-{a:0{width}d}")
                lo = b  # type: ignore[assignment]
        parts.append(f"{prefix}[{','.join(ranges)}]")
    return ",".join(parts)


def _t(v: dt.datetime | None) -> str:
    return v.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S") if v else "Unknown"


def _dur(s: float) -> str:
    s = int(s)
    d, s = divmod(s, 86_400)
    return (f"{d}-" if d else "") + f"{s // 3600:02d}:{s % 3600 // 60:02d}:{s % 60:02d}"


def sacct_text(world: SchedulerWorld) -> bytes:
    """``sacct -P -a -o <SACCT_FIELDS>`` as Slurm prints it at ``world.end``: times in the cluster's local time
    (UTC here) without a zone, ``Unknown`` where unset, a pending job's NodeList ``None assigned``."""
    lines = ["|".join(SACCT_FIELDS)]
    for j in world.slurm:
        n = len(j.hosts) or max(1, j.gpus // 8)
        tres = f"billing={16 * j.gpus},cpu={16 * j.gpus},gres/gpu:{GPU_TYPE}={j.gpus},gres/gpu={j.gpus},mem={240 * j.gpus}G,node={n}"
        running = j.start is not None
        elapsed = ((j.end or world.end).timestamp() - j.start.timestamp()) if j.start else 0
        reason = j.reason if j.state == "PENDING" else "None"
        lines.append("|".join((j.job_id, SLURM_CLUSTER, j.name, j.user, j.account, j.partition, j.qos,
                               j.state, reason, j.exit_code, _t(j.submit), _t(j.submit), _t(j.start) if running else "Unknown", _t(j.end),
                               _dur(elapsed), _dur(j.time_limit_s), str(n), str(16 * j.gpus),
                               hostlist(j.hosts) if j.hosts else "None assigned", tres, tres if running else "")))
    return ("\n".join(lines) + "\n").encode()


def _labels(pairs: dict[str, str]) -> str:
    esc = lambda v: v.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")  # noqa: E731
    return "{" + ",".join(f'{k}="{esc(v)}"' for k, v in pairs.items()) + "}"


def _label_name(key: str) -> str:
    # kube-state-metrics sanitises label keys into Prometheus names: every other character becomes "_"
    return "label_" + re.sub(r"[^a-zA-Z0-9_]", "_", key)


def kube_state_text(world: SchedulerWorld, gpus_per_node: int = 8) -> bytes:
    """kube-state-metrics' pod and node series (text exposition 0.0.4) as scraped at ``world.end``."""
    out: list[str] = []

    def family(name: str, help_: str, rows: list[tuple[dict[str, str], float]]) -> None:
        out.append(f"# HELP {name} {help_}")
        out.append(f"# TYPE {name} gauge")
        out.extend(f"{name}{_labels(lab)} {v:.10g}" for lab, v in rows)

    uid = lambda p: str(uuid.uuid5(uuid.NAMESPACE_URL, f"k8s://{p.namespace}/{p.name}"))  # noqa: E731
    base = lambda p: {"namespace": p.namespace, "pod": p.name, "uid": uid(p)}  # noqa: E731
    pods = world.pods
    family("kube_pod_info", "[STABLE] Information about pod.",
           [({**base(p), "host_ip": "10.0.0.1", "pod_ip": "10.1.0.1", "node": p.node, "created_by_kind": p.owner_kind,
              "created_by_name": p.owner_name, "priority_class": "", "host_network": "false"}, 1) for p in pods])
    family("kube_pod_owner", "[STABLE] Information about the Pod's owner.",
           [({**base(p), "owner_kind": p.owner_kind, "owner_name": p.owner_name, "owner_is_controller": "true"}, 1) for p in pods])
    family("kube_pod_labels", "[STABLE] Kubernetes labels converted to Prometheus labels.",
           [({**base(p), **{_label_name(k): v for k, v in p.labels.items()}}, 1) for p in pods])
    family("kube_pod_container_resource_requests", "The number of requested request resource by a container.",
           [({**base(p), "container": p.name.rsplit("-", 1)[0], "node": p.node, "resource": "nvidia_com_gpu", "unit": "integer"}, p.gpus)
            for p in pods])
    family("kube_pod_status_phase", "[STABLE] The pods current phase.",
           [({**base(p), "phase": ph}, 1 if ph == p.phase else 0) for p in pods for ph in ("Pending", "Succeeded", "Failed", "Unknown", "Running")])
    family("kube_pod_created", "[STABLE] Unix creation timestamp", [(base(p), p.created.timestamp()) for p in pods])
    family("kube_pod_start_time", "[STABLE] Start time in unix timestamp for a pod.", [(base(p), p.started.timestamp()) for p in pods])
    family("kube_pod_completion_time", "[STABLE] Completion time in unix timestamp for a pod.",
           [(base(p), p.completed.timestamp()) for p in pods if p.completed])
    family("kube_node_status_allocatable", "[STABLE] The allocatable for different resources of a node that are available for scheduling.",
           [({"node": n, "resource": "nvidia_com_gpu", "unit": "integer"}, gpus_per_node) for n in K8S_NODES])
    return ("\n".join(out) + "\n").encode()


MIN_JOB_AGE_S = 300  # slurmctld's MinJobAge default: a finished job stays in its answers this long


def _n(v: float | None) -> dict[str, Any]:
    """data_parser v0.0.40's number object: unset where there is none."""
    return {"set": v is not None, "infinite": False, "number": int(v) if v is not None else 0}


def slurmrestd_jobs_json(world: SchedulerWorld, gpus_per_node: int = 8) -> bytes:
    """``GET /slurm/v0.0.40/jobs`` (what ``squeue --json`` prints) at ``world.end``: the jobs slurmctld still
    holds (pending, running, and those ended within ``MIN_JOB_AGE_S``), each node's GPUs with their device
    indices in ``gres_detail``, as Slurm 23.11 answers; a running job's ``end_time`` is its time limit's end."""
    end = world.end.timestamp()
    jobs = []
    for j in world.slurm:
        if j.end is not None and end - j.end.timestamp() > MIN_JOB_AGE_S:
            continue
        per_node = j.gpus // max(1, len(j.hosts)) if j.hosts else j.gpus
        running = j.start is not None
        tres = f"cpu={16 * j.gpus},mem={240 * j.gpus}G,node={len(j.hosts) or max(1, j.gpus // gpus_per_node)},billing={16 * j.gpus},gres/gpu={j.gpus}"
        signal = int(j.exit_code.split(":")[1]) if ":" in j.exit_code else 0
        jobs.append({
            "account": j.account, "accrue_time": _n(j.submit.timestamp()), "cluster": SLURM_CLUSTER, "cpus": _n(16 * j.gpus),
            "eligible_time": _n(j.submit.timestamp()),
            "end_time": _n(j.end.timestamp() if j.end else (j.start.timestamp() + j.time_limit_s if j.start else None)),
            "exit_code": {"status": ["SIGNALED" if signal else "SUCCESS"], "return_code": _n(0), "signal": {"id": _n(signal or None), "name": "TERM" if signal == 15 else ""}},
            "gres_detail": [f"gpu:{GPU_TYPE}:{per_node}(IDX:0-{per_node - 1})" for _ in j.hosts] if running else [],
            "job_id": int(j.job_id), "job_state": [j.state], "name": j.name, "node_count": _n(len(j.hosts) or None),
            "nodes": hostlist(j.hosts) if running else "", "partition": j.partition, "qos": j.qos,
            "start_time": _n(j.start.timestamp() if j.start else None), "state_reason": j.reason if j.state == "PENDING" else "None",
            "submit_time": _n(j.submit.timestamp()), "time_limit": _n(j.time_limit_s // 60), "tres_alloc_str": tres if running else "",
            "tres_per_node": f"gres/gpu:{GPU_TYPE}:{per_node}", "tres_req_str": tres, "user_name": j.user,
        })
    doc = {"jobs": jobs, "last_backfill": _n(end - 30), "last_update": _n(end),
           "meta": {"plugin": {"type": "openapi/slurmctld", "name": "Slurm OpenAPI slurmctld", "data_parser": "data_parser/v0.0.40",
                               "accounting_storage": "accounting_storage/slurmdbd"},
                    "slurm": {"version": {"major": "23", "micro": "10", "minor": "11"}, "release": "23.11.10", "cluster": SLURM_CLUSTER}},
           "errors": [], "warnings": []}
    return (json.dumps(doc, indent=2) + "\n").encode()
