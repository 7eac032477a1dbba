"""gpu_sample.vgpu_license_status: dcgm-exporter's default DCGM_FI_DEV_VGPU_LICENSE_STATUS as a column

Every dcgm-exporter with its default counters exports the field for every GPU. Without a column each GPU was a
series of its own in ``metric_sample``: 8 series and 8 rows a node's push, 16,384 rows a 16,384-GPU scrape (on
PostgreSQL a quarter of the database's time for that scrape). The column comes to ``gpu_sample``, its roll-up
tiers and, on PostgreSQL, the packed layout. Rows already stored as series stay where they are.

Revision ID: 0029
Revises: 0028
Create Date: 2026-12-07
"""
from typing import Sequence, Union

from alembic import op
import sqlalchemy as sa

revision: str = '0029'
down_revision: Union[str, Sequence[str], None] = '0028'
branch_labels: Union[str, Sequence[str], None] = None
depends_on: Union[str, Sequence[str], None] = None

FIELD = "vgpu_license_status"
TIERS = ("gpu_sample_minute", "gpu_sample_hour")
AGGREGATES = ("min", "max", "mean", "last")


def upgrade() -> None:
    op.add_column("gpu_sample", sa.Column(FIELD, sa.BigInteger(), nullable=True,
                                          comment="DCGM_FI_DEV_VGPU_LICENSE_STATUS, as exported (0 on a GPU that is not a licensed vGPU)"))
    for table in TIERS:
        for agg in AGGREGATES:
            op.add_column(table, sa.Column(f"{FIELD}_{agg}", sa.Double() if agg == "mean" else sa.BigInteger(), nullable=True,
                                           comment=f"{agg} of {FIELD} over the bucket"))
    if op.get_bind().dialect.name == "postgresql":
        op.execute(f'ALTER TABLE gpu_sample_packed ADD COLUMN "{FIELD}" bigint[]')


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute(f'ALTER TABLE gpu_sample_packed DROP COLUMN "{FIELD}"')
    for table in TIERS:
        with op.batch_alter_table(table) as batch_op:
            for agg in AGGREGATES:
                batch_op.drop_column(f"{FIELD}_{agg}")
    with op.batch_alter_table("gpu_sample") as batch_op:
        batch_op.drop_column(FIELD)
