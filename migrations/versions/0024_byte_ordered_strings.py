"""Every string column compared and sorted by its bytes on PostgreSQL (COLLATE "C")

The keys the store writes and probes are machine strings: GPU UUIDs, host names, series keys, content hashes.
Under the database's locale collation (C.UTF-8 is one before PostgreSQL 17) every B-tree comparison is a
``strcoll`` of two copied strings, and sorts cannot use abbreviated keys. Measured on PostgreSQL 15 on the
2-core reference machine: probing 65,536 new series keys took 578 ms against 170 ms in byte order, the bulk of
an agent fleet's first round (each node's first push creates and probes its series); a 16,384-row insert into
gpu_sample's key 73-127 ms against 62-77 ms (store/sqltypes.py, ``byte_ordered_strings``).

Only the collation changes: PostgreSQL keeps the table files and rebuilds the indexes on those columns. A
partitioned table's ALTER reaches its partitions. SQLite compares bytes already (BINARY), so it has nothing to do.

Revision ID: 0024
Revises: 0023
Create Date: 2026-12-06
"""
from typing import Sequence, Union

from alembic import op
import sqlalchemy as sa

revision: str = '0024'
down_revision: Union[str, Sequence[str], None] = '0023'
branch_labels: Union[str, Sequence[str], None] = None
depends_on: Union[str, Sequence[str], None] = None

# The string columns of every table (partitions follow their parent) whose collation is not yet the wanted one.
_COLUMNS = sa.text(
    "SELECT c.relname, a.attname, format_type(a.atttypid, a.atttypmod) FROM pg_attribute a"
    " JOIN pg_class c ON c.oid = a.attrelid JOIN pg_namespace n ON n.oid = c.relnamespace"
    " WHERE n.nspname = current_schema() AND c.relkind IN ('r', 'p') AND NOT c.relispartition"
    " AND c.relname <> 'alembic_version' AND a.attnum > 0 AND NOT a.attisdropped"
    " AND a.atttypid IN ('text'::regtype, 'varchar'::regtype) AND a.attcollation <> CAST(:collation AS regcollation)"
    " ORDER BY c.relname, a.attnum"
)


def _collate(collation: str, other: str) -> None:
    bind = op.get_bind()
    if bind.dialect.name != "postgresql":
        return
    by_table: dict[str, list[str]] = {}
    for table, column, type_ in bind.execute(_COLUMNS, {"collation": other}):
        by_table.setdefault(table, []).append(f'ALTER COLUMN "{column}" TYPE {type_} COLLATE {collation}')
    for table, changes in by_table.items():
        # one statement a table: its indexes are rebuilt once, not once a column
        op.execute(f'ALTER TABLE "{table}" ' + ", ".join(changes))


def upgrade() -> None:
    _collate('"C"', '"C"')


def downgrade() -> None:
    _collate('pg_catalog."default"', '"default"')
