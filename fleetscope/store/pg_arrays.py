"""PostgreSQL binary arrays of plain Python columns, encoded in bulk for ``unnest`` writes.

psycopg dumps a list parameter element by element in Python (``types/array.py``): for an agents' group of
16 pushes (128 GPU rows x 30 columns, and the inventory, workload and metric rows) that was 3.5 ms of the
writer's 5 ms of CPU outside the database, on the critical path of every group commit. Here a column of
one Python type is written in PostgreSQL's binary array format (``array_send`` in src/backend/utils/adt/
arrayfuncs.c: ndim, has-null flag, element type oid, per dimension its length and lower bound, then per
element a 4-byte length, -1 for NULL, and the element's binary form) with numpy for null-free numbers and
one join for the rest. The statement casts each parameter to its column's array type, so a float8[] here
becomes a real[] there, as psycopg's own lists did.

Only imported where the database is PostgreSQL.
"""

from __future__ import annotations

import struct
from typing import Any

import numpy as np
import psycopg
from psycopg.adapt import Dumper
from psycopg.pq import Format

_HEAD = struct.Struct(">iiIii")
_LEN = struct.Struct(">i")
_NULL = _LEN.pack(-1)
# (element oid, array oid, numpy record of length + value, struct of length + value)
_FLOAT8 = (701, 1022, np.dtype([("n", ">i4"), ("v", ">f8")]), struct.Struct(">id"))
_INT8 = (20, 1016, np.dtype([("n", ">i4"), ("v", ">i8")]), struct.Struct(">iq"))
_TEXT_OID, _TEXT_ARRAY_OID = 25, 1009
_BOOL_OID, _BOOL_ARRAY_OID = 16, 1000
_TRUE, _FALSE = b"\x00\x00\x00\x01\x01", b"\x00\x00\x00\x01\x00"
_KINDS = (float, int, str, bool)


class _Encoded(bytes):
    """A column already in PostgreSQL's binary array format; its type says which array."""

    array_oid = 0


class Float8Array(_Encoded):
    array_oid = _FLOAT8[1]


class Int8Array(_Encoded):
    array_oid = _INT8[1]


class TextArray(_Encoded):
    array_oid = _TEXT_ARRAY_OID


class BoolArray(_Encoded):
    array_oid = _BOOL_ARRAY_OID


def _dumper(cls: type[_Encoded]) -> type[Dumper]:
    class _PassThrough(Dumper):
        format = Format.BINARY
        oid = cls.array_oid

        def dump(self, obj: Any) -> bytes:
            return bytes(obj)

    return _PassThrough


_DUMPERS = [(cls, _dumper(cls)) for cls in (Float8Array, Int8Array, TextArray, BoolArray)]


def register(conn: psycopg.Connection[Any]) -> None:
    """Teach ``conn`` to send the encoded columns as they are (once per connection)."""
    if getattr(conn, "_fleetscope_arrays", False):
        return
    for cls, dumper in _DUMPERS:
        conn.adapters.register_dumper(cls, dumper)
    conn._fleetscope_arrays = True  # type: ignore[attr-defined]


def _numbers(values: list[Any], spec: tuple[int, int, np.dtype, struct.Struct], has_null: bool) -> bytes:
    if not has_null:
        rec = np.empty(len(values), spec[2])
        rec["n"] = 8
        rec["v"] = values
        return rec.tobytes()
    pack = spec[3].pack
    return b"".join(_NULL if v is None else pack(8, v) for v in values)


def encode(values: list[Any]) -> Any:
    """``values`` (one Python type, NULLs aside) as an encoded array, or the list itself where this does
    not encode it (no value, mixed types, another type): psycopg dumps those as before."""
    first = next((v for v in values if v is not None), None)
    kind = type(first)
    if first is None or kind not in _KINDS or any(type(v) is not kind for v in values if v is not None):
        return values
    has_null = None in values
    if kind is float:
        elem, cls, body = _FLOAT8[0], Float8Array, _numbers(values, _FLOAT8, has_null)
    elif kind is int:
        try:
            elem, cls, body = _INT8[0], Int8Array, _numbers(values, _INT8, has_null)
        except (OverflowError, struct.error):
            return values  # past 64 bits: psycopg sends it as numeric, and the statement's cast names the problem
    elif kind is str:
        pack = _LEN.pack
        elem, cls = _TEXT_OID, TextArray
        body = b"".join(_NULL if b is None else pack(len(b)) + b for b in (None if v is None else v.encode() for v in values))
    else:
        elem, cls = _BOOL_OID, BoolArray
        body = b"".join(_NULL if v is None else (_TRUE if v else _FALSE) for v in values)
    return cls(_HEAD.pack(1, int(has_null), elem, len(values), 1) + body)
