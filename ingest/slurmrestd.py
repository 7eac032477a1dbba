"""Slurm's JSON: slurmrestd responses and the ``--json`` output of ``squeue``, ``sacct`` and ``sinfo``,
across data_parser versions v0.0.37 to v0.0.44 (Slurm 21.08 to 25.11).

One parser reads every shape by what it holds, not by its version string:

- ``jobs`` from slurmctld (``GET /slurm/v0.0.4x/jobs``, ``/job/{id}``, ``squeue --json``): ``job_state`` a
  string (v0.0.37) or a list of state and flags (v0.0.40+); times plain integers (v0.0.37) or
  ``{set, infinite, number}`` objects (v0.0.40+).
- ``jobs`` from slurmdbd (``GET /slurmdb/v0.0.4x/jobs``, ``/job/{id}``, ``sacct --json``): ``time``
  (submission, eligible, start, end, elapsed, limit), ``state`` {current, reason}, ``tres`` {allocated,
  requested} lists, ``steps``.
- ``nodes`` (``/slurm/v0.0.4x/nodes``), ``partitions``, ``accounts`` (``/slurmdb/v0.0.4x/accounts``), and
  ``sinfo --json``'s ``sinfo`` entries (v0.0.39).

GPUs, in order of trust (SOURCES.md's pitfall: clusters whose AccountingStorageTRES lacks ``gres/gpu`` show
GPUs only in the request and the per-node detail): ``gres/gpu`` in ``tres_alloc_str`` or the slurmdb
``tres.allocated`` list, then the per-node ``gres_detail`` (``gpu:h100:2(IDX:0-1),gpu:h200:4(IDX:2-5)``,
which also gives each node's device indices), then ``tres_per_job``, then ``tres_per_node`` × nodes;
``gpu_source`` says which. A pending job's count is what it asks for.

Projections are not facts: slurmctld fills a running job's ``end_time`` with its time limit's end and a
pending job's ``start_time`` with the backfill estimate; those are dropped, and so is any instant after the
snapshot (``last_update``) — an eligible time in the future of a job held by ``--begin``.

Pure: bytes in, a ``Batch`` out; ``ParseError`` names the item and field.
"""

from __future__ import annotations

import datetime as dt
import json
from typing import Any

from fleetscope.core import frames as F
from fleetscope.core import scheduler_frames as S
from fleetscope.core import slurm
from fleetscope.core.errors import ParseError
from ingest.format import FormatSpec, Sniff, SniffView

MAX_INPUT_BYTES = 256 * 2**20
MAX_ITEMS = 2_000_000
_TERMINAL = frozenset({"BOOT_FAIL", "CANCELLED", "COMPLETED", "DEADLINE", "FAILED", "NODE_FAIL", "OUT_OF_MEMORY", "PREEMPTED", "TIMEOUT", "REVOKED"})


def _num(v: Any) -> int | float | None:
    """A number as any data_parser gives it: plain, or ``{set, infinite, number}`` (unset or infinite: None)."""
    if isinstance(v, bool):
        return None
    if isinstance(v, (int, float)):
        return v
    if isinstance(v, dict) and "number" in v:
        if not v.get("set", True) or v.get("infinite", False):
            return None
        return _num(v["number"])
    return None


def _at(v: Any) -> dt.datetime | None:
    n = _num(v)
    if n is None or n <= 0:
        return None
    if n > 32503680000:  # year 3000: not a Unix time
        raise ValueError(f"time {n} out of range")
    return dt.datetime.fromtimestamp(n, dt.UTC)


def _str(v: Any) -> str | None:
    if v is None or isinstance(v, (dict, list)):
        return None
    s = str(v).strip()
    return s or None


def _types(typed: dict[str, int]) -> str | None:
    return ",".join(f"{k}:{v}" for k, v in sorted(typed.items())) or None


def _tres_list(items: Any) -> dict[str, str]:
    """slurmdb's ``tres.allocated`` list ({type, name, count}) as a TRES mapping (``gres/gpu:a100`` -> count)."""
    out: dict[str, str] = {}
    if not isinstance(items, list):
        return out
    for t in items:
        if isinstance(t, dict) and t.get("type") is not None and _num(t.get("count")) is not None:
            name = f"{t['type']}/{t['name']}" if t.get("name") else str(t["type"])
            out[name] = str(int(_num(t["count"]) or 0))
    return out


def _exit(v: Any) -> tuple[int | None, int | None]:
    if isinstance(v, dict):
        sig = v.get("signal")
        return (_int(_num(v.get("return_code"))), _int(_num(sig.get("id")) if isinstance(sig, dict) else None))
    return _int(_num(v)), None


def _int(v: Any) -> int | None:
    return None if v is None else int(v)


class _Out:
    def __init__(self, source: str, cluster: str, observed: dt.datetime | None) -> None:
        self.source, self.cluster, self.observed = source, cluster, observed
        self.jobs: dict[tuple[str, str], dict[str, Any]] = {}
        self.job_nodes: dict[tuple[str, str, str], dict[str, Any]] = {}
        self.steps: dict[tuple[str, str, str, dt.datetime], dict[str, Any]] = {}
        self.nodes: dict[tuple[str, str], dict[str, Any]] = {}
        self.partitions: dict[tuple[str, str], dict[str, Any]] = {}
        self.accounts: dict[tuple[str, str], dict[str, Any]] = {}

    def _past(self, t: dt.datetime | None) -> dt.datetime | None:
        return None if t is None or (self.observed is not None and t > self.observed) else t

    def job(self, j: dict[str, Any]) -> None:
        db = isinstance(j.get("time"), dict)  # slurmdbd's (sacct --json) shape
        cluster = _str(j.get("cluster")) or self.cluster
        job_id = _num(j.get("job_id"))
        if job_id is None:
            raise ValueError("no job_id")
        arr = j.get("array") if db else None
        array_job = _num(arr.get("job_id")) if isinstance(arr, dict) else _num(j.get("array_job_id"))
        task = _num(arr.get("task_id")) if isinstance(arr, dict) else _num(j.get("array_task_id"))
        jid = f"{int(array_job)}_{int(task)}" if array_job and task is not None else str(int(job_id))
        if db:
            st = j.get("state") or {}
            state, by, _ = slurm.job_state(st.get("current") if isinstance(st, dict) else st)
            reason = _str(st.get("reason")) if isinstance(st, dict) else None
            t = j["time"]
            submit, eligible, start, end = _at(t.get("submission")), _at(t.get("eligible")), _at(t.get("start")), _at(t.get("end"))
            elapsed, limit_min = _num(t.get("elapsed")), _num(t.get("limit"))
            tres = j.get("tres") or {}
            alloc = _tres_list(tres.get("allocated"))
            req = _tres_list(tres.get("requested"))
            user = _str(j.get("user"))
            cpus = _num((j.get("required") or {}).get("CPUs")) if isinstance(j.get("required"), dict) else None
        else:
            state, by, _ = slurm.job_state(j.get("job_state"))
            reason = _str(j.get("state_reason"))
            submit, eligible, start, end = (_at(j.get(k)) for k in ("submit_time", "eligible_time", "start_time", "end_time"))
            elapsed, limit_min = None, _num(j.get("time_limit"))
            alloc, req = slurm.parse_tres(_str(j.get("tres_alloc_str"))), slurm.parse_tres(_str(j.get("tres_req_str")))
            user = _str(j.get("user_name"))
            cpus = _num(j.get("cpus"))
        if reason == "None":
            reason = None
        nodes_text = _str(j.get("nodes"))
        if nodes_text is None and isinstance(j.get("job_resources"), dict):
            nodes_text = _str(j["job_resources"].get("nodes"))
        hosts = slurm.expand_hostlist(nodes_text) if state != "PENDING" else []
        gres_detail = j.get("gres_detail") if isinstance(j.get("gres_detail"), list) else []
        gpus, typed = slurm.tres_gpus(alloc)
        gpu_source = "tres_alloc" if gpus is not None else None
        per_node: list[tuple[int, dict[str, int], tuple[int, ...] | None]] = []
        if gres_detail and len(gres_detail) == len(hosts):
            per_node = [slurm.gres_gpus(str(g)) for g in gres_detail]
        if gpus is None and per_node and sum(p[0] for p in per_node):
            gpus, gpu_source = sum(p[0] for p in per_node), "gres_detail"
            typed = {}
            for p in per_node:
                for k, v in p[1].items():
                    typed[k] = typed.get(k, 0) + v
        if gpus is None:
            n, ty = slurm.tres_per_gpus(_str(j.get("tres_per_job")))
            if n is not None:
                gpus, typed, gpu_source = n, ty, "tres_per_job"
        if gpus is None:
            n, ty = slurm.tres_per_gpus(_str(j.get("tres_per_node")))
            count = len(hosts) or int(_num(j.get("node_count")) or 1)
            if n is not None:
                gpus, typed, gpu_source = n * count, {k: v * count for k, v in ty.items()}, "tres_per_node"
        if gpus is None and state == "PENDING":
            n, ty = slurm.tres_gpus(req)
            if n is not None:
                gpus, typed, gpu_source = n, ty, "tres_req"
        if state != "PENDING" and start is not None and end is not None and elapsed is None and state in _TERMINAL:
            elapsed = (end - start).total_seconds()
        if state == "RUNNING" and start is not None and self.observed is not None and elapsed is None:
            elapsed = max(0.0, (self.observed - start).total_seconds())
        ex, sig = _exit(j.get("exit_code"))
        row = {
            "cluster": cluster, "job_id": jid, "scheduler": "slurm", "name": _str(j.get("name")), "user": user,
            "account": _str(j.get("account")), "partition": _str(j.get("partition")), "qos": _str(j.get("qos")),
            "state": state, "state_reason": reason, "cancelled_by": by or _str(j.get("kill_request_user")),
            "exit_code": ex if state in _TERMINAL else None, "exit_signal": sig if state in _TERMINAL else None,
            "dependency": _str(j.get("dependency")),
            "submit_at": self._past(submit), "eligible_at": self._past(eligible),
            "start_at": self._past(start) if state != "PENDING" else None,
            "end_at": self._past(end) if state in _TERMINAL else None,
            "time_limit_s": int(limit_min * 60) if limit_min is not None else None,
            "elapsed_s": int(elapsed) if elapsed is not None else None,
            "gpus": gpus, "gpu_types": _types(typed), "gpu_source": gpu_source, "cpus": _int(cpus),
            "node_count": len(hosts) if hosts else None, "nodes": nodes_text if hosts else None,
            "array_job_id": str(int(array_job)) if array_job else None, "observed_at": self.observed, "source": self.source,
        }
        self.jobs[(cluster, jid)] = row
        for i, h in enumerate(hosts):
            g = per_node[i] if per_node else None
            self.job_nodes[(cluster, jid, h)] = {
                "cluster": cluster, "job_id": jid, "host": h, "source": self.source,
                "gpus": g[0] if g else (gpus if len(hosts) == 1 else None),
                "gpu_types": _types(g[1]) if g else (_types(typed) if len(hosts) == 1 else None),
                "gpu_indices": ",".join(map(str, g[2])) if g and g[2] else None,
            }
        for s in j.get("steps") or [] if db else []:
            self.step(cluster, jid, s)

    def step(self, cluster: str, jid: str, s: dict[str, Any]) -> None:
        if not isinstance(s, dict):
            return
        sid = s.get("step") or {}
        name = _str(sid.get("id")) if isinstance(sid, dict) else _str(sid)
        if not name:
            return
        step = name.split(".", 1)[1] if "." in name else name
        t = s.get("time") or {}
        at = _at(t.get("end")) or _at(t.get("start"))
        if at is None:
            return
        req = (s.get("tres") or {}).get("requested") or {}
        tot, mx = _tres_list(req.get("total")), _tres_list(req.get("max"))
        st, _, _ = slurm.job_state(s.get("state"))
        hosts = (s.get("nodes") or {}).get("list") or []
        self.steps[(cluster, jid, step, at)] = {
            "cluster": cluster, "job_id": jid, "step": step, "observed_at": at, "state": st,
            "host": hosts[0] if len(hosts) == 1 else None, "elapsed_s": _int(_num(t.get("elapsed"))),
            "gpu_util_ratio": int(tot["gres/gpuutil"]) / 100 if "gres/gpuutil" in tot else None,
            "gpu_util_max_ratio": int(mx["gres/gpuutil"]) / 100 if "gres/gpuutil" in mx else None,
            "gpu_mem_bytes": int(tot["gres/gpumem"]) if "gres/gpumem" in tot else None, "source": self.source,
        }

    def node(self, n: dict[str, Any]) -> None:
        name = _str(n.get("name")) or _str(n.get("hostname"))
        if not name:
            raise ValueError("node without a name")
        cluster = _str(n.get("cluster_name")) or self.cluster
        total, typed = slurm.tres_gpus(slurm.parse_tres(_str(n.get("tres"))))
        g_total, g_typed, _ = slurm.gres_gpus(_str(n.get("gres")))
        if total is None or (not typed and g_typed):
            total = g_total if total is None else total
            typed = g_typed
        alloc, _ = slurm.tres_gpus(slurm.parse_tres(_str(n.get("tres_used"))))
        if alloc is None and _str(n.get("gres_used")):
            alloc = slurm.gres_gpus(_str(n.get("gres_used")))[0]
        state = n.get("state")
        state_text = "+".join(str(s) for s in state) if isinstance(state, list) else _str(state)
        parts = n.get("partitions")
        self.nodes[(cluster, name)] = {
            "cluster": cluster, "host": name, "state": state_text, "reason": _str(n.get("reason")),
            "reason_set_by": _str(n.get("reason_set_by_user")), "reason_changed_at": _at(n.get("reason_changed_at")),
            "gpus_total": total if total is not None else 0, "gpus_alloc": alloc if alloc is not None else 0, "gpu_types": _types(typed),
            "cpus_total": _int(_num(n.get("cpus"))), "cpus_alloc": _int(_num(n.get("alloc_cpus"))),
            "partitions": ",".join(map(str, parts)) if isinstance(parts, list) and parts else None,
            "observed_at": self.observed, "source": self.source,
        }

    def sinfo(self, e: dict[str, Any]) -> None:
        names = (e.get("nodes") or {}).get("nodes") or []
        state = (e.get("node") or {}).get("state")
        gres = e.get("gres") or {}
        total, typed, _ = slurm.gres_gpus(_str(gres.get("total")))
        used = slurm.gres_gpus(_str(gres.get("used")))[0]
        reason = e.get("reason") or {}
        part = (e.get("partition") or {}).get("name") if isinstance(e.get("partition"), dict) else None
        for name in names:
            self.nodes[(self.cluster, str(name))] = {
                "cluster": _str(e.get("cluster")) or self.cluster, "host": str(name),
                "state": "+".join(map(str, state)) if isinstance(state, list) else _str(state),
                "reason": _str(reason.get("description")), "reason_set_by": _str(reason.get("user")), "reason_changed_at": _at(reason.get("time")),
                "gpus_total": total, "gpus_alloc": used, "gpu_types": _types(typed),
                "cpus_total": _int(_num((e.get("cpus") or {}).get("total"))), "cpus_alloc": _int(_num((e.get("cpus") or {}).get("allocated"))),
                "partitions": _str(part), "observed_at": self.observed, "source": self.source,
            }

    def partition(self, p: dict[str, Any]) -> None:
        name = _str(p.get("name"))
        if not name:
            raise ValueError("partition without a name")
        cluster = _str(p.get("cluster")) or self.cluster
        tres = slurm.parse_tres(_str((p.get("tres") or {}).get("configured")))
        nodes = p.get("nodes") or {}
        state = (p.get("partition") or {}).get("state")
        self.partitions[(cluster, name)] = {
            "cluster": cluster, "partition": name, "nodes": _str(nodes.get("configured")), "node_count": _int(_num(nodes.get("total"))),
            "gpus_total": slurm.tres_gpus(tres)[0] or 0, "cpus_total": _int(_num((p.get("cpus") or {}).get("total"))),
            "priority_tier": _int(_num((p.get("priority") or {}).get("tier"))),
            "state": "+".join(map(str, state)) if isinstance(state, list) else _str(state), "observed_at": self.observed, "source": self.source,
        }

    def account(self, a: dict[str, Any]) -> None:
        name = _str(a.get("name"))
        if not name:
            raise ValueError("account without a name")
        self.accounts[(self.cluster, name)] = {"cluster": self.cluster, "account": name, "organization": _str(a.get("organization")),
                                               "description": _str(a.get("description")), "source": self.source}

    def batch(self, meta: dict[str, Any]) -> F.Batch:
        jobs = list(self.jobs.values())
        hosts = sorted({k[1] for k in self.nodes} | {k[2] for k in self.job_nodes})
        return F.Batch(
            source=self.source, sched_job=S.frame(S.SCHED_JOB, jobs), sched_job_node=S.frame(S.SCHED_JOB_NODE, list(self.job_nodes.values())),
            sched_step=S.frame(S.SCHED_STEP, list(self.steps.values())), sched_node=S.frame(S.SCHED_NODE, list(self.nodes.values())),
            sched_partition=S.frame(S.SCHED_PARTITION, list(self.partitions.values())),
            sched_account=S.frame(S.SCHED_ACCOUNT, list(self.accounts.values())),
            job=S.frame(F.JOB, S.fleet_jobs(jobs)), host=S.frame(F.HOST, [{"host": h} for h in hosts]), meta=meta,
        )


def data_parser(doc: dict[str, Any]) -> str | None:
    """The data_parser (or, before v0.0.39, openapi plugin) version the document names: ``v0.0.42``."""
    meta = doc.get("meta") if isinstance(doc.get("meta"), dict) else {}
    plugin = meta.get("plugin") or meta.get("plugins") or {}
    if not isinstance(plugin, dict):
        return None
    for key in ("data_parser", "type"):
        v = plugin.get(key)
        if isinstance(v, str) and "/v" in v:
            return v.rsplit("/", 1)[1]
    return None


def parse(data: bytes, *, source: str = "slurmrestd", ts: dt.datetime | None = None, cluster: str = "") -> F.Batch:
    """Jobs, nodes, partitions, accounts of one slurmrestd / ``--json`` document."""
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise TypeError("data must be bytes")
    if len(data) > MAX_INPUT_BYTES:
        raise ParseError(f"input of {len(data)} bytes exceeds {MAX_INPUT_BYTES}", source=source)
    try:
        doc = json.loads(bytes(data))
    except (ValueError, RecursionError) as exc:
        raise ParseError(f"not valid JSON ({str(exc)[:120]})", source=source) from None
    if not isinstance(doc, dict):
        raise ParseError("expected a JSON object (a slurmrestd response)", source=source)
    errors = doc.get("errors")
    kinds = [k for k in ("jobs", "nodes", "partitions", "accounts", "sinfo") if isinstance(doc.get(k), list)]
    if not kinds:
        if errors:
            raise ParseError(f"slurmrestd answered with errors: {json.dumps(errors)[:300]}", source=source)
        raise ParseError("no jobs, nodes, partitions, accounts or sinfo list: not a Slurm JSON document", source=source)
    observed = _at(doc.get("last_update")) or (ts.astimezone(dt.UTC) if ts else None)
    out = _Out(source, cluster, observed)
    for kind in kinds:
        items = doc[kind]
        if len(items) > MAX_ITEMS:
            raise ParseError(f"{len(items)} {kind}, more than {MAX_ITEMS}", source=source)
        read = {"jobs": out.job, "nodes": out.node, "partitions": out.partition, "accounts": out.account, "sinfo": out.sinfo}[kind]
        for i, item in enumerate(items):
            if not isinstance(item, dict):
                raise ParseError(f"{kind}[{i}] is not an object", source=source, field=f"{kind}[{i}]")
            try:
                read(item)
            except (ValueError, TypeError, AttributeError, OverflowError) as exc:
                raise ParseError(f"{kind}[{i}]: {exc}", source=source, field=f"{kind}[{i}]") from None
    return out.batch({"data_parser": data_parser(doc), "kinds": kinds, **{k: len(doc[k]) for k in kinds}})


_MARKERS = ('"data_parser', '"openapi/', '"accrue_time"', '"burstbuffer_network_address"', '"allowed_allocation"', '"coordinators"',
            '"job_state"', '"tres_per_node"', '"association"')


def _looks_like(view: SniffView) -> bool:
    if not view.is_json:
        return False
    head = view.stripped[:8192]
    first = head[1:].lstrip()
    top = any(first.startswith(f'"{k}"') for k in ("jobs", "nodes", "partitions", "accounts", "sinfo", "meta"))
    return top and any(m in head for m in _MARKERS)


FORMATS = (
    FormatSpec("slurmrestd", "Slurm JSON (slurmrestd v0.0.37-v0.0.44, squeue/sacct/sinfo --json): jobs, nodes, partitions, accounts",
               lambda d, s, o: parse(d, source=s, ts=o.ts), sniff=Sniff(12, _looks_like), needs_ts=True),
)
