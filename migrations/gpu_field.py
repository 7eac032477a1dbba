"""A numeric field added to ``gpu_sample`` where every field lives: the raw samples, the minute and hour tiers
(min, max, mean, last of the bucket) and, on PostgreSQL, the packed layout (an array a GPU-hour). Shared by the
revisions that give a dcgm-exporter field a column of its own (0029, 0030)."""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

TIERS = ("gpu_sample_minute", "gpu_sample_hour")
AGGREGATES = ("min", "max", "mean", "last")


def add(field: str, integer: bool, comment: str) -> None:
    """Add ``field`` (bigint where ``integer``, else double precision; a tier's mean is always double)."""
    kind = sa.BigInteger if integer else sa.Double
    op.add_column("gpu_sample", sa.Column(field, kind(), nullable=True, comment=comment))
    for table in TIERS:
        for agg in AGGREGATES:
            op.add_column(table, sa.Column(f"{field}_{agg}", sa.Double() if agg == "mean" else kind(), nullable=True,
                                           comment=f"{agg} of {field} over the bucket"))
    if op.get_bind().dialect.name == "postgresql":
        op.execute(f'ALTER TABLE gpu_sample_packed ADD COLUMN "{field}" {"bigint" if integer else "double precision"}[]')


def drop(field: str) -> None:
    """Remove what ``add`` made."""
    if op.get_bind().dialect.name == "postgresql":
        op.execute(f'ALTER TABLE gpu_sample_packed DROP COLUMN "{field}"')
    for table in TIERS:
        with op.batch_alter_table(table) as batch_op:
            for agg in AGGREGATES:
                batch_op.drop_column(f"{field}_{agg}")
    with op.batch_alter_table("gpu_sample") as batch_op:
        batch_op.drop_column(field)
