"""Slurm's queue as ``squeue --format="%i|%E;%R;%C" --noheader -a`` text: each job's dependency, its
pending reason (or, once running, its node list) and its CPUs (``squeue(1)``: ``%i`` job id, ``%E``
dependency, ``%R`` reason in parentheses for a pending job or the node list for a running one, ``%C`` CPUs).

``%R`` is not escaped, so a reason may itself hold ``;`` (``(Nodes required for job are DOWN, DRAINED or
reserved ...)``): the dependency is the text before the first ``;`` and the CPUs after the last. A reason
in parentheses makes the job PENDING with that ``state_reason``; a node list is expanded into
``sched_job_node`` and leaves the state to a source that knows it (sacct, slurmrestd).

The output has no time: rows are stamped with the time it was taken (``observed_at``). ``squeue --json``
is ``ingest/slurmrestd.py``'s. Pure: bytes in, a ``Batch`` out.
"""

from __future__ import annotations

import datetime as dt
import re

from fleetscope.core import frames as F
from fleetscope.core import scheduler_frames as S
from fleetscope.core import slurm
from fleetscope.core.errors import ParseError
from fleetscope.core.textinput import input_lines
from ingest.format import FormatSpec, Sniff, SniffView

MAX_INPUT_BYTES = 64 * 2**20
MAX_LINE_BYTES = 64 * 1024
_LINE = re.compile(r"^(\d+(?:_\d+|_\[[0-9,\-%]+\])?)\|([^;]*);(.*);(\d+)$")


def parse(data: bytes, *, ts: dt.datetime | None, source: str = "squeue", cluster: str = "") -> F.Batch:
    """One ``sched_job`` row per line; running jobs' nodes in ``sched_job_node``."""
    if ts is None:
        raise ParseError("squeue text has no timestamps: give the time it was taken", source=source)
    jobs, nodes = [], []
    for lineno, text in input_lines(data, source, max_input_bytes=MAX_INPUT_BYTES, max_line_bytes=MAX_LINE_BYTES):
        m = _LINE.match(text)
        if not m:
            raise ParseError("expected JOBID|dependency;reason-or-nodes;cpus (squeue --format='%i|%E;%R;%C')", source=source, line=lineno)
        job_id, dep, where, cpus = m.groups()
        row = {"cluster": cluster, "job_id": job_id, "scheduler": "slurm", "dependency": None if dep in ("(null)", "") else dep,
               "cpus": int(cpus), "observed_at": ts, "source": source,
               "array_job_id": job_id.split("_", 1)[0] if "_" in job_id else None}
        if where.startswith("(") and where.endswith(")"):
            row |= {"state": "PENDING", "state_reason": where[1:-1]}
        else:
            try:
                hosts = slurm.expand_hostlist(where)
            except ValueError as exc:
                raise ParseError(str(exc), source=source, line=lineno, field="nodes") from None
            row |= {"nodes": where, "node_count": len(hosts)}
            nodes += [{"cluster": cluster, "job_id": job_id, "host": h, "source": source} for h in hosts]
        jobs.append(row)
    return F.Batch(source=source, sched_job=S.frame(S.SCHED_JOB, jobs), sched_job_node=S.frame(S.SCHED_JOB_NODE, nodes),
                   meta={"jobs": len(jobs), "pending": sum(1 for j in jobs if j.get("state") == "PENDING")})


def _looks_like(view: SniffView) -> bool:
    lines = [ln for ln in view.stripped.split("\n")[:5] if ln.strip()]
    return bool(lines) and all(_LINE.match(ln.strip()) for ln in lines[:-1] or lines)


FORMATS = (
    FormatSpec("slurm_squeue", "Slurm queue, squeue --format='%i|%E;%R;%C' text: dependencies, pending reasons, running jobs' nodes",
               lambda d, s, o: parse(d, ts=o.ts, source=s), sniff=Sniff(46, _looks_like), needs_ts=True),
)
