"""The push screen: what a push is (``Push``: a parsed batch, or a small dcgm body or OTLP request that the
writer reads, with its content hash and the pushing token's ``Binding``), how its rows are made ready
(``prepare``), and what it must pass before its group forms (``check``): no row dated before the Unix epoch or more than
``FLEETSCOPE_MAX_FUTURE_SKEW_S`` ahead of the server's clock, and no row naming a site or host other than
the one its token is bound to (``Forbidden``). A push refused here changes nothing and is answered alone;
the door (``fleetscope/door/__init__.py``) groups and commits the rest.
"""

from __future__ import annotations

import datetime as dt
import time
from dataclasses import dataclass, field
from typing import Any

import polars as pl

from analyzers import carbon
from fleetscope.core import frames as F
from fleetscope.core.spec import cast_column
from fleetscope.core.errors import FleetscopeError, ValidationError
from ingest import dcgm_lines
from ingest import dcgm


@dataclass(frozen=True)
class Binding:
    """What a bound token's pushes must name. ``None`` fields are unbound."""

    site: str | None = None
    host: str | None = None
    source: str | None = None

    def __bool__(self) -> bool:
        return self.site is not None or self.host is not None or self.source is not None

    def describe(self) -> str:
        return ", ".join(f"{k} {v!r}" for k, v in (("site", self.site), ("host", self.host), ("source", self.source)) if v is not None)


class Forbidden(FleetscopeError):
    """A push its token may not make: rows naming a site or host other than the token's binding. The API
    answers 403 with this message."""


@dataclass
class Push:
    """One input at the door: parsed already (``batch``), or a small dcgm body the writer reads (``dcgm``)."""

    source: str
    sha: str | None  # content hash of the input, for the ingest log
    formats: list[str]
    batch: F.Batch | None = None
    dcgm: bytes | None = None
    ts_us: int = 0  # scrape time of a ``dcgm`` body
    otlp: Any = None  # an OTLP request's readings (``ingest.otlp.read``), built into frames with its group's
    lines: dcgm_lines.Lines | None = None  # a ``dcgm`` body as the line reader read it (``prepare``)
    notes: dict[str, Any] = field(default_factory=dict)
    nbytes: int = 0
    # An input whose hash the ingest log holds writes nothing. Off for JSON batches, whose update-on-
    # conflict frames (sites, findings) may be sent again on purpose to put a value back.
    dedupe: bool = True
    # The pushing token's binding: every row naming a site or host must name the bound one (``check``).
    binding: Binding | None = None


def notes(meta: dict[str, Any]) -> dict[str, Any]:
    """The parsers' small scalar notes (skipped lines, averages, where an id came from), JSON-safe."""
    return {k: v for k, v in meta.items() if isinstance(v, (int, float, str, bool)) or v is None}


def read_lines(push: Push) -> None:
    """Read a small ``dcgm`` push's lines, where it arrives (so the reading of each overlaps the writer's
    commit of the group before it) or in the writer; a body the line reader declines keeps no lines."""
    if push.dcgm is not None and push.lines is None and push.batch is None:
        try:
            push.lines = dcgm_lines.read(push.dcgm)
        except Exception:  # noqa: BLE001 - the columnar parser reads it instead and names what is wrong
            push.lines = None
        if push.lines is not None:
            push.notes = notes(push.lines.meta)


def prepare(push: Push) -> None:
    """Give a ``dcgm`` push its rows: the line reader's, or the columnar parser's where it declines."""
    read_lines(push)
    if push.dcgm is None or push.batch is not None or push.lines is not None:
        return
    push.batch = dcgm.parse(push.dcgm, source=push.source, ts=dt.datetime.fromtimestamp(push.ts_us / 1e6, dt.UTC))
    push.notes = notes(push.batch.meta)


# --- screening: bindings and the future horizon -------------------------------------------------------
#
# Run by the writer on each push alone once its rows are ready, before the group forms, so a refused push
# changes nothing and is answered alone. Each is a few comparisons over what the push already holds: no
# query, and nothing at all for an unbound token's line-read dcgm body beyond one integer comparison.

_HOST_FRAMES = tuple(spec.name for spec in F.FRAMES.values() if "host" in spec.schema)
_SITE_FRAMES = tuple(spec.name for spec in F.FRAMES.values() if "site_id" in spec.schema)
_TIME_COLUMNS = {spec.name: tuple(c.name for c in spec.columns if c.dtype == F.UTC_US) for spec in F.FRAMES.values()}


def _time_columns(spec: F.FrameSpec) -> tuple[str, ...]:
    """A frame's time columns; a batch's ``extra`` frames (monitoring) are outside F.FRAMES."""
    got = _TIME_COLUMNS.get(spec.name)
    return got if got is not None else tuple(c.name for c in spec.columns if c.dtype == F.UTC_US)


def _iso(ts_us: int) -> str:
    return dt.datetime.fromtimestamp(ts_us / 1e6, dt.UTC).isoformat().replace("+00:00", "Z")


def _too_late(frame: str, row: int | None, field_: str, what: str, ts_us: int, horizon_us: int, skew_s: float) -> ValidationError:
    return ValidationError(
        f"{what} at {_iso(ts_us)} is {(ts_us - horizon_us) / 1e6 + skew_s:.0f} s ahead of the server's clock, past the allowed "
        f"{skew_s:g} s (FLEETSCOPE_MAX_FUTURE_SKEW_S); nothing of the push was stored",
        frame=frame, row=row, field=field_)


def _too_early(frame: str, row: int | None, field_: str, what: str, ts_us: int) -> ValidationError:
    return ValidationError(
        f"{what} at {_iso_any(ts_us)} lies before 1970-01-01T00:00:00Z, the earliest time a row may carry; nothing of the push "
        "was stored", frame=frame, row=row, field=field_)


def _iso_any(ts_us: int) -> str:
    """``_iso`` for any instant microseconds can hold, years before 1 included (``datetime`` stops at year 1)."""
    try:
        return _iso(ts_us)
    except (OverflowError, ValueError, OSError):
        return f"{ts_us} µs since the epoch"


def _not_bound(kind: str, named: str | None, binding: Binding, where: str) -> Forbidden:
    bound = binding.site if kind == "site" else binding.host
    said = f"names {kind} {named!r}" if named else f"names no {kind}"
    return Forbidden(f"{where} {said}, and the token is bound to {kind} {bound!r}; nothing of the push was stored")


FORECAST_SERIES = (carbon.INTENSITY_SERIES,)
"""Series whose samples are forecasts, dated in the future by design (a grid operator's carbon-intensity
forecast, which the load-shifting hint reads), so the future-skew check leaves them alone."""


def _forecast(series: pl.Series) -> pl.Series:
    return series.str.split_exact("{", 1).struct.field("field_0").is_in(list(FORECAST_SERIES)).fill_null(False)


def _describe_row(spec: F.FrameSpec, df: pl.DataFrame, row: int) -> str:
    keys = ", ".join(f"{k}={str(df.get_column(k)[row])[:200]!r}" for k in spec.key if k in df.columns and k not in _time_columns(spec))
    return f"{spec.name} row {row}" + (f" ({keys})" if keys else "")


def _screen_batch(batch: F.Batch, horizon_us: int | None, skew_s: float, binding: Binding | None) -> None:
    for spec, df in list(batch.frames()):
        for c in [c for c in _time_columns(spec) if c in df.columns]:
            # JSON records hold RFC 3339 text until the store conforms them: read it the way the store will
            # (a value that does not parse is refused here as it would be there), rows kept in their order.
            at_us = cast_column(spec, spec.col(c), df.get_column(c)).dt.epoch("us")
            early = at_us < 0
            if early.any():
                row = int(early.arg_true()[0])
                raise _too_early(spec.name, row, c, f"{_describe_row(spec, df, row)}: {c}", int(at_us[row]))
            if horizon_us is None:
                continue
            late = at_us > horizon_us
            if spec.name == "metric_sample" and "series" in df.columns:
                late = late & ~_forecast(df.get_column("series").cast(pl.String))
            if late.any():
                row = int(late.arg_true()[0])
                raise _too_late(spec.name, row, c, f"{_describe_row(spec, df, row)}: {c}", int(at_us[row]), horizon_us, skew_s)
        if binding is None:
            continue
        for kind, frames_with, column, bound in (("host", _HOST_FRAMES, "host", binding.host), ("site", _SITE_FRAMES, "site_id", binding.site)):
            if bound is None or spec.name not in frames_with:
                continue
            if column not in df.columns:
                raise _not_bound(kind, None, binding, f"{spec.name} row 0")
            values = df.get_column(column).cast(pl.String)
            bad = (values.fill_null("") != bound).arg_true()
            if len(bad):
                raise _not_bound(kind, values[int(bad[0])], binding, _describe_row(spec, df, int(bad[0])))
        if binding.host is not None and spec.name == "nccl_test":
            hosts = df.get_column("hosts").cast(pl.String) if "hosts" in df.columns else pl.Series([None] * df.height, dtype=pl.String)
            for row, listed in enumerate(hosts.to_list()):
                others = [h for h in (listed or "").split(",") if h.strip() != binding.host]
                if not listed or others:
                    raise _not_bound("host", others[0] if listed else None, binding, _describe_row(spec, df, row))


def _screen_lines(push: Push, lines: dcgm_lines.Lines, horizon_us: int | None, skew_s: float) -> None:
    if push.ts_us < 0 and lines.keys:
        raise _too_early("gpu_sample", 0, "ts", f"gpu_sample of {lines.keys[0]!r} (the push's ts)", push.ts_us)
    if horizon_us is not None and push.ts_us > horizon_us and lines.keys:
        raise _too_late("gpu_sample", 0, "ts", f"gpu_sample of {lines.keys[0]!r} (the push's ts)", push.ts_us, horizon_us, skew_s)
    binding = push.binding
    if binding is not None and binding.host is not None:
        for row, (key, labels) in enumerate(zip(lines.keys, lines.labels)):
            host = dcgm_lines.host_of(labels)
            if host != binding.host:
                raise _not_bound("host", host, binding, f"gpu row {row} (gpu_uuid={key!r})")


def _screen_otlp(walk: Any, horizon_us: int | None, skew_s: float, binding: Binding | None) -> None:
    if horizon_us is not None:
        one_ts_us = walk.__dict__.get("_one_ts_us")  # a template's scrape, every point at one time (otlp_template)
        parts = walk.parts if one_ts_us is None or one_ts_us > horizon_us else ()
        for ts_us, gids, column, _ in parts:
            if len(ts_us) and int(ts_us.max()) > horizon_us:
                i = int(ts_us.argmax())
                uuid = walk.gpus[int(gids[i])]["gpu_uuid"]
                raise _too_late("gpu_sample", None, "ts", f"gpu_sample of {uuid!r} ({column})", int(ts_us[i]), horizon_us, skew_s)
        for ts_us, series in walk.series_rows:
            if ts_us > horizon_us and series.split("{", 1)[0] not in FORECAST_SERIES:
                raise _too_late("metric_sample", None, "ts", f"metric_sample series {series[:200]!r}", ts_us, horizon_us, skew_s)
        for w in walk.workloads:
            if w["ts_us"] > horizon_us:
                raise _too_late("gpu_workload", None, "ts", f"gpu_workload of {w['gpu_uuid']!r}", w["ts_us"], horizon_us, skew_s)
    if binding is not None and binding.host is not None:
        for row, g in enumerate(walk.gpus):
            if g["host"] != binding.host:
                raise _not_bound("host", g["host"], binding, f"gpu row {row} (gpu_uuid={g['gpu_uuid']!r})")
        for c in walk.colls.values():
            if c.get("host") != binding.host:
                raise _not_bound("host", c.get("host"), binding, f"collective of job {c['job_id']!r} rank {c['rank']}")


def check(push: Push, max_future_skew_s: float | None, now_us: int | None = None) -> None:
    """Refuse ``push`` whole when a row lies before the Unix epoch (``ValidationError``, as the remote-write
    parser refuses one; OTLP's unsigned times cannot) or more than ``max_future_skew_s`` past the clock
    (``ValidationError`` naming the row or series and its time) or names a site or host its token is not
    bound to (``Forbidden``). ``None``: no horizon. Run on a prepared push (``prepare``)."""
    horizon_us = None
    if max_future_skew_s is not None:
        horizon_us = (now_us if now_us is not None else time.time_ns() // 1000) + int(max_future_skew_s * 1e6)
    skew_s = max_future_skew_s or 0.0
    if push.lines is not None:
        _screen_lines(push, push.lines, horizon_us, skew_s)
    if push.otlp is not None and push.batch is None:
        _screen_otlp(push.otlp, horizon_us, skew_s, push.binding)
    if push.batch is not None:
        _screen_batch(push.batch, horizon_us, skew_s, push.binding)
