"""gpu_sample.nvlink_throughput_raw: dcgm-exporter's default DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL as a column

The last field of dcgm-exporter's default counters without a column: each GPU was a series of its own in
``metric_sample``, 8 series and 8 rows a node's push and 16,384 rows a 16,384-GPU scrape, and a node's first push
created its 8 series. The value is kept as exported (DCGM states no unit for field 449), so the column is ``_raw``.
It comes to ``gpu_sample``, its roll-up tiers and, on PostgreSQL, the packed layout. Rows already stored as series
stay where they are.

Revision ID: 0030
Revises: 0029
Create Date: 2026-12-07
"""
from typing import Sequence, Union

from alembic import op
import sqlalchemy as sa

revision: str = '0030'
down_revision: Union[str, Sequence[str], None] = '0029'
branch_labels: Union[str, Sequence[str], None] = None
depends_on: Union[str, Sequence[str], None] = None

FIELD = "nvlink_throughput_raw"
TIERS = ("gpu_sample_minute", "gpu_sample_hour")
AGGREGATES = ("min", "max", "mean", "last")


def upgrade() -> None:
    op.add_column("gpu_sample", sa.Column(FIELD, sa.Double(), nullable=True,
                                          comment="DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL (field 449, NVLINK_THROUGHPUT_TOTAL from DCGM 4), as exported"))
    for table in TIERS:
        for agg in AGGREGATES:
            op.add_column(table, sa.Column(f"{FIELD}_{agg}", sa.Double(), nullable=True,
                                           comment=f"{agg} of {FIELD} over the bucket"))
    if op.get_bind().dialect.name == "postgresql":
        op.execute(f'ALTER TABLE gpu_sample_packed ADD COLUMN "{FIELD}" double precision[]')


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute(f'ALTER TABLE gpu_sample_packed DROP COLUMN "{FIELD}"')
    for table in TIERS:
        with op.batch_alter_table(table) as batch_op:
            for agg in AGGREGATES:
                batch_op.drop_column(f"{FIELD}_{agg}")
    with op.batch_alter_table("gpu_sample") as batch_op:
        batch_op.drop_column(FIELD)
