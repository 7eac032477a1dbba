"""Slurm accounting as ``sacct --parsable`` / ``--parsable2`` text and ``sstat --parsable`` text.

``sacct -P`` prints one line per job and one per step (``123.batch``, ``123.extern``, ``123.0``), fields
split by ``|`` (or the ``--delimiter`` given, e.g. the Hábrók tools' ``☃``), with a trailing delimiter under
``--parsable``, and a header line unless ``--noheader``. With a header the fields are read by name
(``sacct(1)`` field names, any order, any subset); without one the field count names the layout: the
37 fields of ``hb-jobinfo``'s ``sacct --format=JobID,JobName,User,...,Comment`` or sacct's default seven
(``JobID,JobName,Partition,Account,AllocCPUS,State,ExitCode``).

What each line gives: job rows become ``sched_job`` (user, account, partition, QOS, state with
``CANCELLED by <uid>`` split, submit/eligible/start/end, time limit, elapsed, GPUs from ``AllocTRES``
``gres/gpu`` — the untyped count, not the typed ones beside it — or from ``ReqTRES`` while pending), their
node list expanded into ``sched_job_node``, and a fleet ``job`` row; step rows become ``sched_step`` (GPU
utilisation ``gres/gpuutil`` and memory ``gres/gpumem`` from ``TRESUsageInTot``/``Max`` where the cluster
gathers them). Older jobs without ``gres/gpu`` in ``AllocTRES`` keep ``gpus`` null: unknown, not zero.

Times: sacct prints the cluster's local time without a zone; they are read as UTC (``tz`` says otherwise),
so durations and queue waits are exact and instants are off by the cluster's offset.

``sstat -P`` (running steps: no times of its own) becomes ``sched_step`` rows stamped with the time given.

Pure: bytes in, a ``Batch`` out; a bad line raises ``ParseError`` with its number and field.
"""

from __future__ import annotations

import datetime as dt
import re
from zoneinfo import ZoneInfo

from fleetscope.core import frames as F
from fleetscope.core import scheduler_frames as S
from fleetscope.core import slurm
from fleetscope.core.errors import ParseError
from fleetscope.core.textinput import input_lines
from ingest.format import FormatSpec, Sniff, SniffView, Splitting, cut_line

MAX_INPUT_BYTES = 512 * 2**20
MAX_LINE_BYTES = 256 * 1024
DELIMITERS = ("|", "\u2603", "\t")

# hb-jobinfo's layout (rug-cit-hpc/hb-jobinfo, sacct --format=... --noheader), and sacct's default fields.
HABROK_FIELDS = (
    "JobID JobName User Partition NodeList NNodes NCPUS NTasks State Submit Start End Timelimit Elapsed TotalCPU "
    "CPUTime UserCPU SystemCPU ReqMem MaxRSS MaxVMSize ReqTRES AllocTRES TRESUsageInMax TRESUsageInTot "
    "TRESUsageOutTot MaxDiskRead MaxDiskWrite MaxRSSNode MaxRSSTask MaxVMSizeNode MaxVMSizeTask MaxDiskReadNode "
    "MaxDiskReadTask MaxDiskWriteNode MaxDiskWriteTask Comment"
).split()
DEFAULT_FIELDS = ("JobID", "JobName", "Partition", "Account", "AllocCPUS", "State", "ExitCode")
SSTAT_FIELDS = (
    "JobID NTasks MaxRSS MaxVMSize TRESUsageInMax TRESUsageInTot TRESUsageOutTot MaxDiskRead MaxDiskWrite "
    "MaxRSSNode MaxRSSTask MaxVMSizeNode MaxVMSizeTask MaxDiskReadNode MaxDiskReadTask MaxDiskWriteNode MaxDiskWriteTask"
).split()
LAYOUTS = {len(HABROK_FIELDS): HABROK_FIELDS, len(DEFAULT_FIELDS): DEFAULT_FIELDS}
_JOBID = re.compile(r"^(\d+(?:_\d+|_\[[0-9,\-%]+\])?(?:\+\d+)?)(?:\.([A-Za-z0-9_\-]+))?$")
_SIZE = re.compile(r"^(\d+(?:\.\d+)?)([KMGTP]?)$")
_UNIT = {"": 1, "K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40, "P": 2**50}
_NOT_A_TIME = frozenset({"", "None", "Unknown", "N/A"})


def _delimiter(first: str) -> str:
    for d in DELIMITERS:
        if d in first:
            return d
    raise ParseError("no field delimiter ('|', '\u2603' or tab) in the first line: expected sacct --parsable output")


def _fields(line: str, delim: str, trailing: bool) -> list[str]:
    parts = line.split(delim)
    if trailing and parts and parts[-1] == "":
        parts.pop()
    return parts


def _time(text: str, tz: dt.tzinfo) -> dt.datetime | None:
    text = text.strip()
    if text in _NOT_A_TIME:
        return None
    try:
        t = dt.datetime.fromisoformat(text)
    except ValueError:
        raise ValueError(f"bad time {text[:40]!r}") from None
    return (t.replace(tzinfo=tz) if t.tzinfo is None else t).astimezone(dt.UTC)


def _bytes(text: str | None) -> int | None:
    if not text:
        return None
    m = _SIZE.match(text.strip())
    if not m:
        raise ValueError(f"bad size {text[:40]!r}")
    return int(float(m.group(1)) * _UNIT[m.group(2)])


def _int(text: str | None) -> int | None:
    if text is None or text.strip() in ("", "None", "Unknown"):
        return None
    try:
        return int(text)
    except ValueError:
        raise ValueError(f"{text[:40]!r} is not a whole number") from None


def _usage(tres_text: str | None) -> dict[str, object]:
    tres = slurm.parse_tres(tres_text)
    out: dict[str, object] = {}
    if "gres/gpuutil" in tres:
        out["util"] = _int(tres["gres/gpuutil"])
    if "gres/gpumem" in tres:
        out["mem"] = _bytes(tres["gres/gpumem"])
    if "cpu" in tres:
        out["cpu"] = slurm.parse_duration_s(tres["cpu"])
    return out


def _types(typed: dict[str, int]) -> str | None:
    return ",".join(f"{k}:{v}" for k, v in sorted(typed.items())) or None


class _Reader:
    def __init__(self, source: str, tz: dt.tzinfo, ts: dt.datetime | None, cluster: str) -> None:
        self.source, self.tz, self.ts, self.cluster = source, tz, ts, cluster
        self.jobs: dict[str, dict[str, object]] = {}
        self.nodes: dict[tuple[str, str], dict[str, object]] = {}
        self.steps: dict[tuple[str, str, dt.datetime], dict[str, object]] = {}

    def job(self, r: dict[str, str]) -> None:
        state, by, _ = slurm.job_state(r.get("State"))
        alloc = slurm.parse_tres(r.get("AllocTRES"))
        gpus, typed = slurm.tres_gpus(alloc)
        gpu_source = "tres_alloc" if gpus is not None else None
        if gpus is None and state == "PENDING":
            gpus, typed = slurm.tres_gpus(slurm.parse_tres(r.get("ReqTRES")))
            gpu_source = "tres_req" if gpus is not None else None
        exit_code = signal = None
        if r.get("ExitCode"):
            code, _, sig = r["ExitCode"].partition(":")
            exit_code, signal = _int(code), _int(sig or None)
        elapsed = slurm.parse_duration_s(r.get("Elapsed"))
        limit = slurm.parse_duration_s(r.get("Timelimit"))
        hosts = slurm.expand_hostlist(r.get("NodeList"))
        nnodes = _int(r.get("NNodes"))
        start = _time(r.get("Start", ""), self.tz)
        row = {
            "cluster": r.get("Cluster") or self.cluster, "job_id": r["JobID"], "scheduler": "slurm", "name": r.get("JobName") or None,
            "user": r.get("User") or None, "account": r.get("Account") or None, "partition": r.get("Partition") or None,
            "qos": r.get("QOS") or None, "state": state, "cancelled_by": by, "state_reason": r.get("Reason") or None,
            "exit_code": exit_code, "exit_signal": signal,
            "submit_at": _time(r.get("Submit", ""), self.tz), "eligible_at": _time(r.get("Eligible", ""), self.tz),
            "start_at": start if state != "PENDING" else None,
            "end_at": _time(r.get("End", ""), self.tz) if state not in ("PENDING", "RUNNING", "SUSPENDED") else None,
            "time_limit_s": int(limit) if limit is not None else None,
            "elapsed_s": int(elapsed) if elapsed is not None else None,
            "gpus": gpus, "gpu_types": _types(typed), "gpu_source": gpu_source,
            "cpus": _int(r.get("NCPUS") or r.get("AllocCPUS")), "node_count": nnodes if hosts else (nnodes if state != "PENDING" else None),
            "nodes": r.get("NodeList") if hosts else None,
            "array_job_id": r["JobID"].split("_", 1)[0] if "_" in r["JobID"] else None, "source": self.source,
        }
        cluster = str(row["cluster"])
        self.jobs[r["JobID"]] = row
        for h in hosts:
            # AllocTRES is the job's total: per node only when the job has one node.
            self.nodes[(r["JobID"], h)] = {"cluster": cluster, "job_id": r["JobID"], "host": h, "source": self.source,
                                           "gpus": gpus if len(hosts) == 1 else None,
                                           "gpu_types": _types(typed) if len(hosts) == 1 else None}

    def step(self, job_id: str, step: str, r: dict[str, str], at: dt.datetime | None) -> None:
        if at is None:
            return
        tot, mx = _usage(r.get("TRESUsageInTot")), _usage(r.get("TRESUsageInMax"))
        state, _, _ = slurm.job_state(r.get("State")) if r.get("State") else (None, None, ())
        elapsed = slurm.parse_duration_s(r.get("Elapsed"))
        hosts = slurm.expand_hostlist(r.get("NodeList") or r.get("MaxRSSNode"))
        self.steps[(job_id, step, at)] = {
            "cluster": r.get("Cluster") or self.cluster, "job_id": job_id, "step": step, "observed_at": at, "state": state,
            "host": hosts[0] if len(hosts) == 1 else None, "elapsed_s": int(elapsed) if elapsed is not None else None,
            "gpu_util_ratio": tot["util"] / 100 if tot.get("util") is not None else None,
            "gpu_util_max_ratio": mx["util"] / 100 if mx.get("util") is not None else None,
            "gpu_mem_bytes": tot.get("mem"), "max_rss_bytes": _bytes(r.get("MaxRSS")), "cpu_s": tot.get("cpu"), "source": self.source,
        }

    def batch(self, **meta: object) -> F.Batch:
        jobs = list(self.jobs.values())
        return F.Batch(
            source=self.source, sched_job=S.frame(S.SCHED_JOB, jobs), sched_job_node=S.frame(S.SCHED_JOB_NODE, list(self.nodes.values())),
            sched_step=S.frame(S.SCHED_STEP, list(self.steps.values())), job=S.frame(F.JOB, S.fleet_jobs(jobs)),
            host=S.frame(F.HOST, [{"host": h} for h in sorted({n["host"] for n in self.nodes.values()})]),
            meta={"jobs": len(jobs), "steps": len(self.steps), **meta},
        )


def _read(data: bytes, source: str, *, known: dict[int, tuple[str, ...]], what: str) -> tuple[list[tuple[int, dict[str, str]]], str]:
    lines = input_lines(data, source, max_input_bytes=MAX_INPUT_BYTES, max_line_bytes=MAX_LINE_BYTES, strip=False)
    lines = [(n, t.rstrip("\r\n")) for n, t in lines]
    try:
        delim = _delimiter(lines[0][1])
    except ParseError as exc:
        raise ParseError(exc.message, source=source, line=lines[0][0]) from None
    first = lines[0][1].split(delim)
    header = None
    if first and first[0].strip() == "JobID":
        header = [h.strip() for h in first]
        trailing = header[-1] == ""
        if trailing:
            header.pop()
        lines = lines[1:]
    else:
        trailing = first[-1] == ""
        n = len(first) - (1 if trailing else 0)
        if n not in known:
            raise ParseError(f"{n} fields and no header: not a {what} layout this parser knows ({', '.join(map(str, sorted(known)))} fields); "
                             "print the header (drop --noheader)", source=source, line=lines[0][0])
        header = list(known[n])
    rows = []
    for lineno, text in lines:
        parts = _fields(text, delim, trailing)
        if len(parts) != len(header):
            raise ParseError(f"{len(parts)} fields, expected {len(header)} (a cut line, or {delim!r} inside a field)", source=source, line=lineno)
        rows.append((lineno, dict(zip(header, (p.strip() for p in parts)))))
    return rows, delim


def _split_id(text: str, source: str, lineno: int) -> tuple[str, str | None]:
    m = _JOBID.match(text)
    if not m:
        raise ParseError(f"{text[:40]!r} is not a Slurm job id", source=source, line=lineno, field="JobID")
    return m.group(1), m.group(2)


def parse(data: bytes, *, source: str = "sacct", tz: str = "UTC", cluster: str = "") -> F.Batch:
    """``sacct --parsable[2]`` text: jobs, their nodes and steps."""
    rows, _ = _read(data, source, known=LAYOUTS, what="sacct")
    reader = _Reader(source, ZoneInfo(tz), None, cluster)
    for lineno, r in rows:
        job_id, step = _split_id(r.get("JobID", ""), source, lineno)
        field = ""
        try:
            if step is None:
                field = "row"
                reader.job(r)
            else:
                field = "End"
                at = _time(r.get("End", ""), reader.tz) or _time(r.get("Start", ""), reader.tz)
                reader.step(job_id, step, r, at)
        except ValueError as exc:
            raise ParseError(str(exc), source=source, line=lineno, field=field or None) from None
    if not reader.jobs and not reader.steps:
        raise ParseError("no job or step rows", source=source)
    return reader.batch()


def parse_sstat(data: bytes, *, ts: dt.datetime, source: str = "sstat", cluster: str = "") -> F.Batch:
    """``sstat --parsable`` text: running steps' use, stamped ``ts`` (sstat prints no time)."""
    if ts is None:
        raise ParseError("sstat output has no timestamps: give the time it was taken", source=source)
    rows, _ = _read(data, source, known={len(SSTAT_FIELDS): tuple(SSTAT_FIELDS)}, what="sstat")
    reader = _Reader(source, dt.UTC, ts, cluster)
    for lineno, r in rows:
        job_id, step = _split_id(r.get("JobID", ""), source, lineno)
        try:
            reader.step(job_id, step or "", r, ts.astimezone(dt.UTC))
        except ValueError as exc:
            raise ParseError(str(exc), source=source, line=lineno) from None
    return reader.batch()


def _count_fields(view: SniffView) -> tuple[str, int, bool] | None:
    line = view.stripped.split("\n", 1)[0].rstrip("\r")
    for d in DELIMITERS:
        if d in line:
            parts = line.split(d)
            return parts[0].strip(), len(parts) - (1 if parts[-1] == "" else 0), parts[0].strip() == "JobID"
    return None


def _looks_like_sacct(view: SniffView) -> bool:
    got = _count_fields(view)
    if not got:
        return False
    first, n, header = got
    if header:
        return "State" in view.stripped.split("\n", 1)[0]
    return bool(_JOBID.match(first)) and n in LAYOUTS


def _looks_like_sstat(view: SniffView) -> bool:
    got = _count_fields(view)
    if not got:
        return False
    first, n, header = got
    if header:
        head = view.stripped.split("\n", 1)[0]
        return "State" not in head and "TRESUsageInTot" in head
    return bool(_JOBID.match(first)) and n == len(SSTAT_FIELDS)


FORMATS = (
    FormatSpec("slurm_sacct", "Slurm accounting, sacct --parsable text: jobs with account, state, times, GPUs (AllocTRES gres/gpu), nodes, steps",
               lambda d, s, o: parse(d, source=s), sniff=Sniff(44, _looks_like_sacct), streaming=Splitting(cut_line, header=False)),
    FormatSpec("slurm_sstat", "Slurm running steps, sstat --parsable text: GPU utilisation and memory per step (stamped with the time taken)",
               lambda d, s, o: parse_sstat(d, ts=o.ts, source=s), sniff=Sniff(45, _looks_like_sstat), needs_ts=True),
)
