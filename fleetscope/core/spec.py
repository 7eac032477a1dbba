"""How a canonical frame is declared and checked: ``Col`` and ``FrameSpec`` (columns, dtypes, natural
key, conflict rule), and ``conform``, which casts a frame to its spec or raises ``ValidationError`` naming
the frame, the first bad row and the field. ``fleetscope.core.frames`` declares the frames with these;
``fleetscope.store.schema`` builds the SQL tables from the same declarations.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import polars as pl

from fleetscope.core.errors import ValidationError

UTC_US = pl.Datetime("us", "UTC")

@dataclass(frozen=True)
class Col:
    """One canonical column.

    ``key`` columns form the natural key: two rows with equal keys are the same fact, so writing a
    row twice keeps one copy. Keys are never null; where "no value" is meaningful (a host-level
    health event has no GPU) the column carries ``default`` instead.
    """

    name: str
    dtype: pl.DataType
    key: bool = False
    nullable: bool = True
    default: Any = None
    doc: str = ""
    # A time column whose values start a period of this many seconds (a minute's start: 60): a value inside one
    # is refused rather than rounded, as a store that keeps the period's offset would round it.
    step_s: int | None = None

    @property
    def required(self) -> bool:
        """A column the writer must supply (no default to fill in)."""
        return (self.key or not self.nullable) and self.default is None

@dataclass(frozen=True)
class FrameSpec:
    """A canonical frame: its columns, natural key and how a re-sent row is treated.

    ``on_conflict``: ``"ignore"`` keeps the first copy (telemetry is immutable once observed);
    ``"fill"`` keeps the first copy of each field and fills in the fields the stored row lacks from a later
    copy (a wide sample whose fields a sender split over several requests, as Prometheus remote write
    and OpenTelemetry Collectors do past their batch size); ``"update"`` lets the newer row win (inventory
    and findings describe current state).
    """

    name: str
    columns: tuple[Col, ...]
    on_conflict: str = "ignore"
    doc: str = ""

    @property
    def schema(self) -> dict[str, pl.DataType]:
        return {c.name: c.dtype for c in self.columns}

    @property
    def key(self) -> tuple[str, ...]:
        return tuple(c.name for c in self.columns if c.key)

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(c.name for c in self.columns)

    def col(self, name: str) -> Col:
        for c in self.columns:
            if c.name == name:
                return c
        raise KeyError(name)

    def empty(self) -> pl.DataFrame:
        return pl.DataFrame(schema=self.schema)

def _k(name: str, dtype: pl.DataType, default: Any = None, doc: str = "") -> Col:
    return Col(name, dtype, key=True, nullable=False, default=default, doc=doc)

def _f(name: str, dtype: pl.DataType = pl.Float64, doc: str = "") -> Col:
    return Col(name, dtype, doc=doc)

def _r(name: str, dtype: pl.DataType, doc: str = "") -> Col:
    """Required, not part of the key."""
    return Col(name, dtype, nullable=False, doc=doc)

def _first_bad(mask: pl.Series) -> int | None:
    if not mask.any():  # an aggregate is a fraction of arg_true's cost, and most checks find nothing
        return None
    idx = mask.arg_true()
    return int(idx[0]) if len(idx) else None

# Up to this many rows a text column is checked for NUL in Python: a polars string expression costs
# ~0.2 ms whatever its size, and a group commit's frames of a few hundred rows are checked per column.
_SMALL_ROWS = 4096

def _has_nul(s: pl.Series) -> int | None:
    """The first row whose text holds a NUL character, or None."""
    if s.null_count() == s.len():
        return None
    if s.len() <= _SMALL_ROWS:
        return next((i for i, v in enumerate(s.to_list()) if v and "\x00" in v), None)
    return _first_bad(s.str.contains("\x00", literal=True).fill_null(False))

def _first_nonfinite(s: pl.Series) -> int | None:
    """The first row holding NaN or an infinity, or None. A finite sum proves every value finite (an
    aggregate costs microseconds, ``is_finite`` a fraction of a millisecond); only a sum that is not
    finite (a bad value, or an overflow) looks row by row."""
    if s.null_count() == s.len():
        return None
    total = s.sum()
    if total is not None and math.isfinite(total):
        return None
    return _first_bad((s.is_not_null() & ~s.is_finite()).fill_null(False))

def cast_column(spec: FrameSpec, col: Col, s: pl.Series) -> pl.Series:
    """Cast one column to its canonical dtype, or raise naming the first row that does not fit."""
    target = col.dtype
    if s.dtype == target:
        out = s
    elif target == UTC_US:
        if isinstance(s.dtype, pl.Datetime):
            out = s.dt.replace_time_zone("UTC") if s.dtype.time_zone is None else s.dt.convert_time_zone("UTC")
            out = out.dt.cast_time_unit("us")
        elif s.dtype == pl.String:
            out = s.str.to_datetime(time_unit="us", time_zone="UTC", strict=False)
        elif s.dtype == pl.Null:
            out = s.cast(target)
        else:
            raise ValidationError(f"expected a UTC timestamp, got a column of {s.dtype}", frame=spec.name, row=0, field=col.name)
    elif target == pl.String and s.dtype not in (pl.Null, pl.Categorical, pl.Enum) and not isinstance(s.dtype, (pl.Categorical, pl.Enum)):
        # Numbers silently turned into strings hide a column mix-up (a key read from the wrong field).
        raise ValidationError(f"expected text, got a column of {s.dtype}", frame=spec.name, row=0, field=col.name)
    elif target in (pl.Int64,) and s.dtype.is_float():
        # A float is an integer only where it has no fraction; 1.5 GPUs is a bad row, not 1.
        frac = s.is_not_null() & (s != s.round(0))
        bad = _first_bad(frac.fill_null(False) | (s.is_not_null() & ~s.is_finite()).fill_null(False))
        if bad is not None:
            raise ValidationError(f"{s[bad]!r} is not an integer", frame=spec.name, row=bad, field=col.name)
        out = s.cast(target, strict=False)
    else:
        out = s.cast(target, strict=False)
    # A cast that lost values (text that is no number or time) has more nulls than its input.
    if out is not s and s.dtype != pl.Null and out.null_count() != s.null_count():
        bad = _first_bad(s.is_not_null() & out.is_null())
        if bad is not None:
            want = "UTC timestamp (RFC 3339)" if target == UTC_US else str(target)
            raise ValidationError(f"{s[bad]!r} is not a valid {want}", frame=spec.name, row=bad, field=col.name)
    if target == pl.String and out.dtype == pl.String:
        # Neither database stores NUL in text (PostgreSQL refuses it mid-COPY); refuse it up front.
        bad = _has_nul(out)
        if bad is not None:
            raise ValidationError("text contains a NUL character", frame=spec.name, row=bad, field=col.name)
    if target == pl.Float64:
        bad = _first_nonfinite(out)
        if bad is not None:
            raise ValidationError(f"{out[bad]!r} is not a finite number", frame=spec.name, row=bad, field=col.name)
    if col.step_s and target == UTC_US:
        bad = _first_bad((out.dt.epoch("us") % (col.step_s * 1_000_000) != 0).fill_null(False))
        if bad is not None:
            raise ValidationError(f"{out[bad]} is not the start of a {col.step_s}-second period", frame=spec.name, row=bad, field=col.name)
    return out

def require_columns(df: object, frame: str, cols: Iterable[str]) -> None:
    """The check an analyzer makes of its input: a polars frame (TypeError otherwise) holding ``cols``
    (ValidationError naming the frame and the first missing column)."""
    if not isinstance(df, pl.DataFrame):
        raise TypeError(f"{frame} must be a polars DataFrame, not {type(df).__name__}")
    for c in cols:
        if c not in df.columns:
            raise ValidationError("missing required column", frame=frame, field=c)

def conform(spec: FrameSpec, df: pl.DataFrame) -> pl.DataFrame:
    """Check ``df`` against ``spec`` and return it in canonical shape: every column, canonical dtypes,
    defaults filled, rows with a repeated natural key collapsed to one.

    Raises ``ValidationError`` naming the frame, the first bad row (0-based, in ``df``'s order) and the
    field: an unknown column, a value that does not cast, a non-finite float, a missing key.
    """
    unknown = [c for c in df.columns if c not in spec.schema]
    if unknown:
        raise ValidationError(f"unknown column (expected some of {', '.join(spec.names)})", frame=spec.name, field=unknown[0])
    out: dict[str, pl.Series] = {}
    for col in spec.columns:
        if col.name in df.columns:
            s = cast_column(spec, col, df.get_column(col.name))
            if col.default is not None and s.null_count():
                s = s.fill_null(col.default)
        elif col.default is not None:
            s = pl.repeat(col.default, df.height, dtype=col.dtype, eager=True)
        elif col.required:
            raise ValidationError("missing required column", frame=spec.name, row=0 if df.height else None, field=col.name)
        else:
            s = pl.Series(col.name, [None] * df.height, dtype=col.dtype)
        if (not col.nullable or col.key) and s.null_count():
            bad = _first_bad(s.is_null())
            if bad is not None:
                raise ValidationError("missing value in a required field", frame=spec.name, row=bad, field=col.name)
        out[col.name] = s.alias(col.name)
    frame = pl.DataFrame(out)
    if spec.key and frame.height > 1:
        if spec.on_conflict == "fill":
            key = list(spec.key)
            if frame.select(pl.struct(key).is_duplicated().any()).item():
                frame = frame.group_by(key, maintain_order=True).agg(pl.exclude(key).drop_nulls().first()).select(frame.columns)
        else:
            keep = "last" if spec.on_conflict == "update" else "first"
            frame = frame.unique(subset=list(spec.key), keep=keep, maintain_order=True)
    return frame

def _json_type_ok(dtype: pl.DataType, value: Any) -> bool:
    if dtype == pl.String or dtype == UTC_US:
        return isinstance(value, str)
    if dtype == pl.Boolean:
        return isinstance(value, bool)
    if dtype == pl.Int64:
        return (isinstance(value, int) and not isinstance(value, bool)) or (isinstance(value, float) and value.is_integer())
    if dtype == pl.Float64:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    return False

_JSON_TYPE_NAME = {pl.String: "a string", pl.Boolean: "true or false", pl.Int64: "an integer", pl.Float64: "a number"}

def from_records(spec: FrameSpec, records: list[Any]) -> pl.DataFrame:
    """Build a canonical frame from JSON-like records (a list of objects), checking each value's type.

    Raises ``ValidationError`` naming the first bad record (0-based) and field: a record that is not an
    object, an unknown field, or a value of the wrong JSON type (timestamps are RFC 3339 strings).
    The result still goes through ``conform`` on write.
    """
    columns: dict[str, list[Any]] = {}
    for i, rec in enumerate(records):
        if not isinstance(rec, dict):
            raise ValidationError(f"expected an object, got {type(rec).__name__}", frame=spec.name, row=i)
        for k, v in rec.items():
            if k not in spec.schema:
                raise ValidationError(f"unknown field (expected some of {', '.join(spec.names)})", frame=spec.name, row=i, field=str(k)[:100])
            if v is not None and not _json_type_ok(spec.schema[k], v):
                want = "an RFC 3339 timestamp string" if spec.schema[k] == UTC_US else _JSON_TYPE_NAME.get(spec.schema[k], str(spec.schema[k]))
                raise ValidationError(f"{str(v)[:80]!r} is not {want}", frame=spec.name, row=i, field=k)
            if k not in columns:
                columns[k] = [None] * i
            columns[k].append(v)
        for k, col in columns.items():
            if len(col) < i + 1:
                col.append(None)
    data = {}
    for k, values in columns.items():
        dtype = spec.schema[k]
        src = pl.String if dtype == UTC_US else dtype
        data[k] = pl.Series(k, [float(v) if src == pl.Float64 and v is not None else v for v in values], dtype=src, strict=False)
    return pl.DataFrame(data, height=len(records)) if data else pl.DataFrame(height=len(records))
