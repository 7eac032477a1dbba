"""Job lifecycle events (JSON Lines, Fleetscope's own schema) → ``job_event``, ``step`` and ``job`` rows.

There is no standard wire format for training-job lifecycle events, so Fleetscope defines one
(``docs/job_events.md`` is the user-facing copy of this schema). One JSON object (RFC 8259) per
line, UTF-8, ``\\n``-separated:

Required on every line

* ``job_id`` — string, 1–256 characters, the scheduler's job id.
* ``ts`` — when the event happened: an RFC 3339 string *with* a zone (``2025-03-01T12:00:00.5Z``,
  ``...+02:00``) or a number of seconds since the Unix epoch (int or float). Stored as UTC, µs.
* ``kind`` — one of ``fleetscope.core.frames.JOB_EVENT_KINDS`` (``allocated``, ``started``,
  ``initialized``, ``step``, ``checkpoint_save_start``, ``checkpoint_save_end``,
  ``checkpoint_restore_start``, ``checkpoint_restore_end``, ``failure``, ``preempted``,
  ``restart``, ``finished``), the record kind ``sdc_rerun`` (below), or ``job`` for a metadata-only
  line (below).

Optional

* ``rank`` — integer ≥ 0; absent or null for a job-level event (stored as rank -1).
* ``step`` — integer ≥ 0; required when ``kind`` is ``step``.
* ``job`` — an object of job metadata, allowed on any line (see below).
* payload — every other field, kept verbatim as a JSON object string in ``job_event.payload``.
  Fields Fleetscope reads are type-checked: ``cause`` (string, for ``failure`` / ``preempted`` /
  ``restart``), ``tokens`` (integer ≥ 0), ``model_flops`` (number ≥ 0, FLOPs of the step),
  ``loss`` (finite number), ``grad_norm`` (number ≥ 0), ``param_checksum`` (string or integer),
  ``start`` / ``end`` (timestamps, as ``ts``), ``duration_s``, ``compute_s``, ``comm_s``,
  ``comm_overlap_s``, ``idle_s`` (numbers ≥ 0, seconds). Anything else is passed through.

Numbers must be finite: RFC 8259 JSON has no NaN or Infinity (send a diverged loss as ``null``
with a ``cause``).

SDC rerun records (``kind`` ``sdc_rerun``): one line per run of a suspect step in the rerun protocol
(analyzers/sdc.py). ``step`` and ``rank`` (required) name the suspect step and rank; ``ts`` is when
the run finished, so replays of one rank need distinct ``ts`` (the natural key includes no attempt).
Payload: ``suspect_gpu`` (string, required: the GPU the step first ran on), ``gpu_uuid`` (string,
required: the GPU this run ran on; equal to ``suspect_gpu`` for a same-GPU replay), ``result``
(string or integer, required: the digest of this run's output, of the same kind as the original's),
``attempt`` (integer ≥ 0, optional: 0 = this line reports the original run, needed when the step
events carried no ``param_checksum`` for that rank and step; absent or ≥ 1 = a replay), ``expected``
(string or integer, optional: the healthy replicas' result; by default the replica majority of the
step's checksums). Records are not lifecycle events: goodput and MTBF ignore them.

Derived rows

* Every event line → one ``job_event`` row, natural key (job_id, ts, kind, rank). A line re-sent
  verbatim is one row; a second line with the same key but a different payload is dropped too
  (first wins, as the store does) and counted in ``meta["conflicting_duplicates"]``.
* A ``step`` event whose span is known → one ``step`` row: ``end`` = ``end`` or else ``ts``;
  ``start`` = ``start`` or else ``end - duration_s``; plus ``tokens``, ``model_flops``,
  ``compute_s``, ``comm_s``, ``comm_overlap_s``, ``idle_s``. A step event with neither ``start``
  nor ``duration_s`` has no span and makes no step row (``meta["steps_without_span"]``).
* A ``job`` object → one ``job`` row per job_id with ``name``, ``kind`` (``training`` or
  ``inference``), ``model_name``, ``world_size`` (integer ≥ 1), ``site_id``, ``owner``,
  ``submitted_at`` / ``started_at`` / ``ended_at`` (timestamps) and ``status``. Several objects for
  one job in a batch merge field by field, later lines winning, matching the ``job`` frame's
  update-on-conflict semantics. Lifecycle events never fill ``job`` fields implicitly: a job row
  says only what its producer said.

Malformed input — not UTF-8, NUL bytes, a line over 1 MiB, invalid JSON (including a last line cut
short), a missing or mistyped field, a value out of range — raises ``ParseError`` naming the
source, the 1-based line and the field. Blank lines are ignored.
"""

from __future__ import annotations

import json
import math
import re
from datetime import datetime, timedelta, timezone
from typing import Any

import polars as pl

from fleetscope.core.errors import ParseError
from fleetscope.core.textinput import input_lines, json_object, unterminated_line
from fleetscope.core.frames import JOB, JOB_EVENT, JOB_EVENT_KINDS, STEP, Batch
from ingest.format import FormatSpec, Sniff, SniffView, Splitting, cut_line

MAX_LINE_BYTES = 1 << 20
MAX_INPUT_BYTES = 1 << 30
_I64_MAX = 2**63 - 1
_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)
_MAX_EPOCH_S = 4102444800  # 2100-01-01: beyond it a number is not an epoch in seconds (ms? µs?)
_RFC3339 = re.compile(r"^\d{4}-\d{2}-\d{2}[Tt ]\d{2}:\d{2}:\d{2}(?:\.\d{1,9})?(?:[Zz]|[+-]\d{2}:\d{2})$")
_ENVELOPE = ("job_id", "ts", "kind", "rank", "step", "job")
_SECONDS = ("duration_s", "compute_s", "comm_s", "comm_overlap_s", "idle_s")
_JOB_FIELDS_STR = ("name", "model_name", "site_id", "owner", "status")
_JOB_KINDS = ("training", "inference")


def parse(data: bytes, *, source: str = "") -> Batch:
    """Parse job lifecycle events (schema in this module's docstring) into a Batch."""
    events: dict[tuple[str, datetime, str, int], tuple[dict[str, Any], str]] = {}
    steps: dict[tuple[str, int, int, datetime], dict[str, Any]] = {}
    jobs: dict[str, dict[str, Any]] = {}
    meta: dict[str, Any] = {"duplicates_dropped": 0, "conflicting_duplicates": 0, "steps_without_span": 0,
                            "job_lines": 0}

    lines = _lines(data, source)
    cut = unterminated_line(data)
    for lineno, text in lines:
        obj = json_object(text, source, lineno, unterminated=lineno == cut)
        f = _Fields(source, lineno)
        job_id = f.string(obj.get("job_id"), "job_id", required=True, max_len=256)
        ts = f.timestamp(obj.get("ts"), "ts", required=True)
        kind = obj.get("kind")
        if kind != "job" and kind not in JOB_EVENT_KINDS:
            raise ParseError(f"kind {str(kind)[:40]!r} is not one of {', '.join(JOB_EVENT_KINDS)} or 'job'",
                             source=source, line=lineno, field="kind")
        rank = f.integer(obj.get("rank"), "rank")
        step = f.integer(obj.get("step"), "step")
        if "job" in obj:
            _merge_job(jobs, job_id, obj["job"], f)
        if kind == "job":
            if "job" not in obj:
                raise ParseError("a kind 'job' line needs a job object", source=source, line=lineno, field="job")
            meta["job_lines"] += 1
            continue
        if kind == "step" and step is None:
            raise ParseError("a step event needs a step number", source=source, line=lineno, field="step")
        payload = {k: v for k, v in obj.items() if k not in _ENVELOPE}
        known = _check_payload(payload, f)
        if kind == "sdc_rerun":
            _check_rerun(rank, step, payload, f)
        rank_key = -1 if rank is None else rank
        key = (job_id, ts, kind, rank_key)
        payload_json = json.dumps(payload, sort_keys=True, separators=(",", ":")) if payload else None
        if key in events:
            meta["duplicates_dropped"] += 1
            if events[key][1] != payload_json:
                meta["conflicting_duplicates"] += 1
            continue
        events[key] = ({"job_id": job_id, "ts": ts, "kind": kind, "rank": rank_key, "step": step,
                        "payload": payload_json}, payload_json or "")
        if kind == "step":
            srow = _step_row(job_id, rank_key, step, ts, known, f)
            if srow is None:
                meta["steps_without_span"] += 1
            else:
                steps.setdefault((job_id, rank_key, step, srow["start"]), srow)

    event_rows = [e for e, _ in events.values()]
    return Batch(
        source=source,
        job_event=pl.DataFrame(event_rows, schema=JOB_EVENT.schema) if event_rows else JOB_EVENT.empty(),
        step=pl.DataFrame(list(steps.values()), schema=STEP.schema) if steps else None,
        job=pl.DataFrame([{"job_id": j, **v} for j, v in jobs.items()], schema=JOB.schema) if jobs else None,
        meta=meta,
    )


def _check_payload(p: dict[str, Any], f: _Fields) -> dict[str, Any]:
    """Type-check the payload fields Fleetscope reads; return them parsed."""
    out: dict[str, Any] = {}
    if "cause" in p:
        out["cause"] = f.string(p["cause"], "cause", max_len=4096)
    out["tokens"] = f.integer(p.get("tokens"), "tokens")
    out["model_flops"] = f.number(p.get("model_flops"), "model_flops")
    out["loss"] = f.number(p.get("loss"), "loss", minimum=None)
    out["grad_norm"] = f.number(p.get("grad_norm"), "grad_norm")
    f.digest(p.get("param_checksum"), "param_checksum")
    for k in _SECONDS:
        out[k] = f.number(p.get(k), k)
    out["start"] = f.timestamp(p.get("start"), "start")
    out["end"] = f.timestamp(p.get("end"), "end")
    _finite_everywhere(p, f, "")
    return out


def _check_rerun(rank: int | None, step: int | None, p: dict[str, Any], f: _Fields) -> None:
    """An ``sdc_rerun`` record names the suspect step and rank, the suspect GPU, the GPU this run ran on
    and its result; ``attempt`` 0 marks the original run's result, ``expected`` the healthy replicas'."""
    if step is None:
        raise ParseError("an sdc_rerun record needs the suspect step", source=f.source, line=f.line, field="step")
    if rank is None:
        raise ParseError("an sdc_rerun record needs the suspect rank", source=f.source, line=f.line, field="rank")
    f.string(p.get("suspect_gpu"), "suspect_gpu", required=True, max_len=256)
    f.string(p.get("gpu_uuid"), "gpu_uuid", required=True, max_len=256)
    f.digest(p.get("result"), "result", required=True)
    f.digest(p.get("expected"), "expected")
    f.integer(p.get("attempt"), "attempt")


def _step_row(job_id: str, rank: int, step: int, ts: datetime, k: dict[str, Any], f: _Fields) -> dict[str, Any] | None:
    end = k["end"] or ts
    if k["start"] is not None:
        start = k["start"]
    elif k["duration_s"] is not None:
        start = end - timedelta(microseconds=round(k["duration_s"] * 1e6))
    else:
        return None
    if start > end:
        raise ParseError("step start is after its end", source=f.source, line=f.line, field="start")
    return {"job_id": job_id, "rank": rank, "step": step, "start": start, "end": end, "compute_s": k["compute_s"],
            "comm_s": k["comm_s"], "comm_overlap_s": k["comm_overlap_s"], "idle_s": k["idle_s"],
            "tokens": k["tokens"], "model_flops": k["model_flops"]}


def _merge_job(jobs: dict[str, dict[str, Any]], job_id: str, job: Any, f: _Fields) -> None:
    if not isinstance(job, dict):
        raise ParseError("job must be an object", source=f.source, line=f.line, field="job")
    row = jobs.setdefault(job_id, {})
    for k in _JOB_FIELDS_STR:
        if job.get(k) is not None:
            row[k] = f.string(job[k], f"job.{k}", max_len=1024)
    if job.get("kind") is not None:
        if job["kind"] not in _JOB_KINDS:
            raise ParseError(f"job kind must be training or inference, got {str(job['kind'])[:40]!r}",
                             source=f.source, line=f.line, field="job.kind")
        row["kind"] = job["kind"]
    if job.get("world_size") is not None:
        ws = f.integer(job["world_size"], "job.world_size")
        if ws is not None and ws < 1:
            raise ParseError("world_size must be at least 1", source=f.source, line=f.line, field="job.world_size")
        row["world_size"] = ws
    for k in ("submitted_at", "started_at", "ended_at"):
        if job.get(k) is not None:
            row[k] = f.timestamp(job[k], f"job.{k}")


def _finite_everywhere(v: Any, f: _Fields, path: str) -> None:
    """Free-form payload too: a non-finite float would make the stored payload invalid JSON."""
    if isinstance(v, float) and not math.isfinite(v):
        raise ParseError("non-finite number", source=f.source, line=f.line, field=path or None)
    if isinstance(v, dict):
        for k, x in v.items():
            _finite_everywhere(x, f, f"{path}.{k}" if path else k)
    elif isinstance(v, list):
        for i, x in enumerate(v):
            _finite_everywhere(x, f, f"{path}[{i}]")


class _Fields:
    """Typed field readers that raise ParseError naming source, line and field."""

    def __init__(self, source: str, line: int):
        self.source, self.line = source, line

    def _err(self, msg: str, field: str) -> ParseError:
        return ParseError(msg, source=self.source, line=self.line, field=field)

    def string(self, v: Any, field: str, *, required: bool = False, max_len: int = 256) -> str | None:
        if v is None:
            if required:
                raise self._err("missing", field)
            return None
        if not isinstance(v, str):
            raise self._err(f"expected a string, got {type(v).__name__}", field)
        if not v.strip() or len(v) > max_len or any(ord(c) < 32 for c in v if c not in "\t\n"):
            raise self._err(f"string must be 1-{max_len} printable characters", field)
        return v

    def integer(self, v: Any, field: str) -> int | None:
        if v is None:
            return None
        if isinstance(v, bool) or not isinstance(v, int):
            raise self._err(f"expected an integer, got {str(v)[:40]!r}", field)
        if v < 0 or v > _I64_MAX:
            raise self._err(f"integer {v} outside 0..2^63-1", field)
        return v

    def digest(self, v: Any, field: str, *, required: bool = False) -> str | None:
        """A checksum or hash: a string or an integer, compared as its decimal text."""
        if v is None:
            if required:
                raise self._err("missing", field)
            return None
        if isinstance(v, bool) or not isinstance(v, (str, int)):
            raise self._err("must be a string or an integer", field)
        if isinstance(v, str) and not 1 <= len(v) <= 1024:
            raise self._err("must be 1-1024 characters", field)
        return str(v)

    def number(self, v: Any, field: str, *, minimum: float | None = 0.0) -> float | None:
        if v is None:
            return None
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise self._err(f"expected a number, got {str(v)[:40]!r}", field)
        try:
            x = float(v)
        except OverflowError:
            raise self._err("number too large", field) from None
        if not math.isfinite(x):
            raise self._err("non-finite number", field)
        if minimum is not None and x < minimum:
            raise self._err(f"{x} is below {minimum}", field)
        return x

    def timestamp(self, v: Any, field: str, *, required: bool = False) -> datetime | None:
        if v is None:
            if required:
                raise self._err("missing", field)
            return None
        if isinstance(v, bool):
            raise self._err("expected a timestamp, got a boolean", field)
        if isinstance(v, (int, float)):
            x = self.number(v, field)
            if x is None or x > _MAX_EPOCH_S:
                raise self._err(f"epoch seconds {v} past 2100 (milliseconds?)", field)
            return _EPOCH + timedelta(microseconds=round(x * 1e6))
        if isinstance(v, str) and _RFC3339.match(v):
            t = re.sub(r"[Zz]$", "+00:00", v)
            t = re.sub(r"(\.\d{6})\d+", r"\1", t)  # fromisoformat stops at microseconds
            try:
                return datetime.fromisoformat(t).astimezone(timezone.utc)
            except ValueError:
                pass
        raise self._err(f"expected RFC 3339 with a zone or epoch seconds, got {str(v)[:40]!r}", field)


def _lines(data: bytes, source: str) -> list[tuple[int, str]]:
    return input_lines(data, source, max_input_bytes=MAX_INPUT_BYTES, max_line_bytes=MAX_LINE_BYTES)


# --- declaration (ingest.format) ---------------------------------------------------------------------


def _looks_like(view: SniffView) -> bool:
    obj = view.first_object if view.is_json else None
    return obj is not None and "job_id" in obj and "kind" in obj


FORMATS = (
    FormatSpec("job_events", "job lifecycle events, JSON Lines (docs/job_events.md)",
               lambda d, s, o: parse(d, source=s), sniff=Sniff(13, _looks_like), streaming=Splitting(cut_line)),
)
