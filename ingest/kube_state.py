"""Kubernetes pods and their GPU requests from kube-state-metrics' ``/metrics`` (Prometheus text 0.0.4).

The series read, as kube-state-metrics documents them (docs/metrics/workload/pod-metrics.md,
docs/metrics/cluster/node-metrics.md; extended resources have ``/`` and ``.`` replaced by ``_`` in the
``resource`` label, so ``nvidia.com/gpu`` is ``nvidia_com_gpu``):

- ``kube_pod_info{namespace,pod,uid,node,created_by_kind,created_by_name}``: where a pod runs, its owner;
- ``kube_pod_owner{namespace,pod,owner_kind,owner_name,owner_is_controller}``: its controller (a Job,
  PyTorchJob, JobSet, ReplicaSet);
- ``kube_pod_container_resource_requests{namespace,pod,container,node,resource="nvidia_com_gpu",unit="integer"}``:
  GPUs each container asks for, summed per pod;
- ``kube_pod_status_phase{namespace,pod,phase}`` (the phase whose value is 1), ``kube_pod_created``,
  ``kube_pod_start_time``, ``kube_pod_completion_time`` (Unix seconds);
- ``kube_pod_labels{namespace,pod,label_<name>=...}``: the pod's labels (for team mapping by label);
- ``kube_node_status_allocatable{node,resource="nvidia_com_gpu"}``: GPUs per node.

A pod becomes a ``sched_job`` (scheduler ``kubernetes``, ``job_id`` ``namespace/pod``, ``account`` the
namespace, state from the phase: Pending, Running, Succeeded -> COMPLETED, Failed -> FAILED) with its node
in ``sched_job_node``; a node with GPUs a ``sched_node``. Which GPUs a pod holds comes from dcgm-exporter's
pod attribution (``gpu_workload``), joined on (namespace, pod). Rows are stamped with the scrape time.

The pods of one distributed training run are one fleet ``job``: pods whose controller is a batch Job or a
training operator's job (Kubeflow's PyTorchJob, MPIJob, TFJob, XGBoostJob, PaddleJob, JAXJob, TrainJob;
KubeRay's RayJob) are grouped by it, and a JobSet's pods (owned by its child Jobs, labelled
``jobset.sigs.k8s.io/jobset-name``, which kube-state-metrics exposes as ``label_jobset_sigs_k8s_io_jobset_name``
where its label allowlist admits it) by the JobSet. The ``job`` row (``namespace/Kind/name``) holds the GPUs of
all its pods as its world size, the first creation and start, the last completion once every pod has one,
and a status from its pods' phases (running while one runs, failed once one failed, completed when all
succeeded).
Pure: bytes in, a ``Batch`` out.
"""

from __future__ import annotations

import datetime as dt
import json

from fleetscope.core import frames as F
from fleetscope.core import scheduler_frames as S
from fleetscope.core.errors import ParseError
from fleetscope.core.promtext import lex_line
from fleetscope.core.textinput import input_lines
from ingest.format import FormatSpec, Sniff, SniffView

MAX_INPUT_BYTES = 256 * 2**20
MAX_LINE_BYTES = 64 * 1024
GPU_RESOURCES = frozenset({"nvidia_com_gpu", "amd_com_gpu", "gpu_intel_com_i915"})
_PHASE = {"Pending": "PENDING", "Running": "RUNNING", "Succeeded": "COMPLETED", "Failed": "FAILED", "Unknown": None}
TRAINING_CONTROLLERS = frozenset({"PyTorchJob", "MPIJob", "TFJob", "XGBoostJob", "PaddleJob", "JAXJob", "TrainJob", "RayJob", "JobSet"})
BATCH_CONTROLLERS = TRAINING_CONTROLLERS | {"Job"}
JOBSET_LABEL = "jobset_sigs_k8s_io_jobset_name"  # jobset.sigs.k8s.io/jobset-name as kube-state-metrics names it


def _at(v: float) -> dt.datetime | None:
    return dt.datetime.fromtimestamp(v, dt.UTC) if 0 < v < 32503680000 else None


def parse(data: bytes, *, ts: dt.datetime | None, source: str = "kube-state-metrics", cluster: str = "") -> F.Batch:
    """Pods (with their GPU requests) and GPU nodes of one kube-state-metrics scrape."""
    if ts is None:
        raise ParseError("a kube-state-metrics scrape has no timestamps: give the time it was taken", source=source)
    pods: dict[tuple[str, str], dict[str, object]] = {}
    labels: dict[tuple[str, str], dict[str, str]] = {}
    nodes: dict[str, int] = {}

    def pod(lab: dict[str, str], n: int) -> dict[str, object]:
        ns, name = lab.get("namespace"), lab.get("pod")
        if not ns or not name:
            raise ParseError("pod series without namespace and pod labels", source=source, line=n)
        return pods.setdefault((ns, name), {"cluster": cluster, "job_id": f"{ns}/{name}", "scheduler": "kubernetes", "account": ns,
                                            "name": name, "observed_at": ts, "source": source})

    for n, text in input_lines(data, source, max_input_bytes=MAX_INPUT_BYTES, max_line_bytes=MAX_LINE_BYTES):
        got = lex_line(text, n, source)
        if got is None:
            continue
        _, metric, pairs, value, _ = got
        if not metric.startswith("kube_"):
            continue
        lab = dict(pairs)
        if metric == "kube_pod_info":
            p = pod(lab, n)
            if lab.get("node"):
                p["nodes"], p["node_count"] = lab["node"], 1
            if lab.get("created_by_kind") and lab.get("created_by_name") and "controller" not in p:
                p["controller"] = f"{lab['created_by_kind']}/{lab['created_by_name']}"
        elif metric == "kube_pod_owner" and lab.get("owner_is_controller", "true") == "true" and lab.get("owner_kind") not in (None, "<none>"):
            pod(lab, n)["controller"] = f"{lab['owner_kind']}/{lab.get('owner_name', '')}"
        elif metric == "kube_pod_container_resource_requests" and lab.get("resource") in GPU_RESOURCES:
            p = pod(lab, n)
            p["gpus"] = int(p.get("gpus") or 0) + int(value)  # type: ignore[call-overload]
            p["gpu_source"] = "k8s_request"
            if lab.get("node"):
                p["nodes"], p["node_count"] = lab["node"], 1
        elif metric == "kube_pod_status_phase" and value == 1:
            pod(lab, n)["state"] = _PHASE.get(lab.get("phase", ""))
        elif metric in ("kube_pod_created", "kube_pod_start_time", "kube_pod_completion_time"):
            col = {"kube_pod_created": "submit_at", "kube_pod_start_time": "start_at", "kube_pod_completion_time": "end_at"}[metric]
            pod(lab, n)[col] = _at(value)
        elif metric == "kube_pod_labels":
            labels[(lab.get("namespace", ""), lab.get("pod", ""))] = {k[6:]: v for k, v in lab.items() if k.startswith("label_")}
            pod(lab, n)
        elif metric == "kube_node_status_allocatable" and lab.get("resource") in GPU_RESOURCES and lab.get("node"):
            nodes[lab["node"]] = int(value)
    for key, lab in labels.items():
        if key in pods and lab:
            pods[key]["labels"] = json.dumps(lab, sort_keys=True)
    for p in pods.values():
        if p.get("start_at") and p.get("end_at"):
            p["elapsed_s"] = int((p["end_at"] - p["start_at"]).total_seconds())  # type: ignore[operator]
        elif p.get("start_at") and p.get("state") == "RUNNING":
            p["elapsed_s"] = max(0, int((ts - p["start_at"]).total_seconds()))  # type: ignore[operator]
    if not pods and not nodes:
        raise ParseError("no kube_pod_* or kube_node_status_allocatable series: not a kube-state-metrics scrape", source=source)
    jobs = list(pods.values())
    for p in jobs:
        jobset = (labels.get((str(p["account"]), str(p["name"]))) or {}).get(JOBSET_LABEL)
        if jobset:
            p["controller"] = f"JobSet/{jobset}"
    fleet_jobs = _controller_jobs(jobs, cluster)
    job_nodes = [{"cluster": cluster, "job_id": p["job_id"], "host": p["nodes"], "gpus": p.get("gpus"), "source": source} for p in jobs if p.get("nodes")]
    alloc: dict[str, int] = {}
    for p in jobs:
        if p.get("nodes") and p.get("state") == "RUNNING":
            alloc[str(p["nodes"])] = alloc.get(str(p["nodes"]), 0) + int(p.get("gpus") or 0)  # type: ignore[call-overload]
    node_rows = [{"cluster": cluster, "host": h, "gpus_total": g, "gpus_alloc": alloc.get(h, 0), "observed_at": ts, "source": source} for h, g in nodes.items()]
    hosts = sorted({str(r["host"]) for r in job_nodes} | set(nodes))
    return F.Batch(source=source, sched_job=S.frame(S.SCHED_JOB, jobs), sched_job_node=S.frame(S.SCHED_JOB_NODE, job_nodes),
                   sched_node=S.frame(S.SCHED_NODE, node_rows), host=S.frame(F.HOST, [{"host": h} for h in hosts]),
                   job=S.frame(F.JOB, fleet_jobs) if fleet_jobs else None,
                   meta={"pods": len(jobs), "gpu_pods": sum(1 for p in jobs if p.get("gpus")), "gpu_nodes": len(nodes), "controller_jobs": len(fleet_jobs)})


def _controller_jobs(pods: list[dict[str, object]], cluster: str) -> list[dict[str, object]]:
    """One fleet ``job`` row per batch or training controller, over its pods."""
    groups: dict[tuple[str, str, str], list[dict[str, object]]] = {}
    for p in pods:
        kind, _, name = str(p.get("controller") or "").partition("/")
        if kind in BATCH_CONTROLLERS and name:
            groups.setdefault((str(p["account"]), kind, name), []).append(p)
    out = []
    for (ns, kind, name), members in sorted(groups.items()):
        states = {m.get("state") for m in members}
        ends = [m.get("end_at") for m in members]
        status = ("running" if "RUNNING" in states else "failed" if "FAILED" in states else "completed" if states == {"COMPLETED"} else "pending")
        starts = [m["start_at"] for m in members if m.get("start_at")]
        submits = [m["submit_at"] for m in members if m.get("submit_at")]
        gpus = sum(int(m.get("gpus") or 0) for m in members)  # type: ignore[call-overload]
        out.append({"job_id": S.fleet_job_id(cluster, f"{ns}/{kind}/{name}"), "name": name, "kind": "training" if kind in TRAINING_CONTROLLERS else None,
                    "world_size": gpus or None, "owner": ns, "submitted_at": min(submits) if submits else None,  # type: ignore[type-var]
                    "started_at": min(starts) if starts else None,  # type: ignore[type-var]
                    "ended_at": max(ends) if ends and all(ends) and status != "running" else None,  # type: ignore[type-var]
                    "status": status})
    return out


def _looks_like(view: SniffView) -> bool:
    head = view.text[:65536]
    return ("# TYPE kube_pod_" in head or "\nkube_pod_" in head or head.startswith("kube_pod_")) and "DCGM_FI_" not in head


FORMATS = (
    FormatSpec("kube_state_metrics", "Kubernetes pods with GPU requests and GPU nodes from kube-state-metrics /metrics",
               lambda d, s, o: parse(d, ts=o.ts, source=s), sniff=Sniff(36, _looks_like), needs_ts=True),
)
