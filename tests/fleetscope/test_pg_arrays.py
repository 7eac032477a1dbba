"""store.pg_arrays: columns encoded as PostgreSQL binary arrays read back as they were sent."""

from __future__ import annotations

import psycopg
import pytest

from fleetscope.store import pg_arrays


@pytest.fixture
def conn(pg_url: str):  # type: ignore[no-untyped-def]
    with psycopg.connect(pg_url.replace("postgresql+psycopg://", "postgresql://", 1)) as c:
        pg_arrays.register(c)
        yield c


@pytest.mark.parametrize(("values", "sql_type", "encoded_as"), [
    ([1.5, -2.25, 0.0, float("inf")], "float8", pg_arrays.Float8Array),
    ([1.5, None, -2.0], "float8", pg_arrays.Float8Array),
    ([0, -1, 2**63 - 1, -(2**63)], "int8", pg_arrays.Int8Array),
    ([7, None, 9], "int8", pg_arrays.Int8Array),
    (["GPU-1", "", "ü €", None], "text", pg_arrays.TextArray),
    ([True, None, False], "bool", pg_arrays.BoolArray),
])
def test_an_encoded_column_reads_back_as_sent(conn, values, sql_type, encoded_as):
    encoded = pg_arrays.encode(values)
    assert type(encoded) is encoded_as
    assert conn.execute(f"SELECT %b::{sql_type}[]", (encoded,)).fetchone()[0] == values


def test_the_statement_casts_to_the_column_type(conn):
    assert conn.execute("SELECT %b::real[], %b::integer[], %b::varchar[]",
                        (pg_arrays.encode([1.5, 0.25]), pg_arrays.encode([3, 4]), pg_arrays.encode(["a"]))).fetchone() == ([1.5, 0.25], [3, 4], ["a"])


@pytest.mark.parametrize("values", [[], [None, None], [1, 2.0], [2**64]])
def test_what_it_does_not_encode_is_left_to_psycopg(values):
    assert pg_arrays.encode(values) is values
