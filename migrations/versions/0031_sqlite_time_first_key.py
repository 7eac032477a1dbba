"""SQLite: raw GPU samples and their pods keyed (ts, gpu_uuid), so that a write's rows land at the end of the key

SQLite's write-ahead log takes whole pages: a commit writes every page its transaction dirtied. Keyed
``(gpu_uuid, ts)``, a scrape's or an agent group's rows land one per GPU across the whole key index, so the pages a
commit writes grow with the table until there is one per row. Keyed ``(ts, gpu_uuid)`` they land together at the
index's end. ``benchmarks/sqlite_key_order.py`` measured a 16,384-GPU scrape written as agent-sized groups of 384
rows: 0.72 s a scrape at the second and 1.47 s at the twelfth against 0.22 and 0.21 s (README, "How fast").
``gpu_workload`` (a row per busy GPU and scrape: on a Kubernetes fleet, about every GPU) had the same key.

Reads keep their plans where they give a time range (every read of raw samples does, ``store.reads``); a single
GPU's range now scans every GPU's rows of that range, the price of the embedded store's writes not slowing as it
fills. PostgreSQL is unchanged: its log records rows, not pages, and its raw samples are keyed by integer GPU id
in day partitions (0026).

Revision ID: 0031
Revises: 0030
Create Date: 2026-12-07
"""
from typing import Sequence, Union

from alembic import op

revision: str = '0031'
down_revision: Union[str, Sequence[str], None] = '0030'
branch_labels: Union[str, Sequence[str], None] = None
depends_on: Union[str, Sequence[str], None] = None

TABLES = ("gpu_sample", "gpu_workload")
GPU_FIRST = "PRIMARY KEY (gpu_uuid, ts)"
TIME_FIRST = "PRIMARY KEY (ts, gpu_uuid)"


def upgrade() -> None:
    for table in TABLES:
        _rekey(table, GPU_FIRST, TIME_FIRST)


def downgrade() -> None:
    for table in TABLES:
        _rekey(table, TIME_FIRST, GPU_FIRST)


def _rekey(table: str, old: str, new: str) -> None:
    """Rebuild SQLite's ``table`` with ``new`` for its primary key: the table's own CREATE statement with the key
    swapped (so columns added by later revisions come along), its rows copied in the new key's order, its indexes
    made again from their own statements."""
    conn = op.get_bind()
    if conn.dialect.name != "sqlite":
        return
    create = conn.exec_driver_sql("SELECT sql FROM sqlite_master WHERE type = 'table' AND name = ?", (table,)).scalar()
    if create is None or old not in create:
        raise RuntimeError(f"{table}'s key is not {old}: {create!r}")
    indexes = conn.exec_driver_sql("SELECT sql FROM sqlite_master WHERE type = 'index' AND tbl_name = ? AND sql IS NOT NULL",
                                   (table,)).scalars().all()
    # the table's name as SQLite keeps it: bare as created, quoted once a rename made it
    conn.exec_driver_sql(f"CREATE TABLE _rekey_{table} " + create[create.index("("):].replace(old, new))
    order = new.removeprefix("PRIMARY KEY (").removesuffix(")")
    conn.exec_driver_sql(f"INSERT INTO _rekey_{table} SELECT * FROM {table} ORDER BY {order}")
    conn.exec_driver_sql(f"DROP TABLE {table}")
    conn.exec_driver_sql(f"ALTER TABLE _rekey_{table} RENAME TO {table}")
    for sql in indexes:
        conn.exec_driver_sql(sql)
