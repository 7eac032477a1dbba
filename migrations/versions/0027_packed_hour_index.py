"""gpu_sample_packed: a B-tree on hour (PostgreSQL)

The packed days were read by GPU (the primary key, gpu_uuid then hour) or by whole days, which partition
pruning and the BRIN index on hour served. Once the day under way is packed an hour at a time
(services/packing.py), today's packed partition is in every read of a recent range: each instant a fleet panel
probes asks it for an hour it does not hold, and the BRIN index answers that with a scan of the partition's
summarised pages. Over 1,024 GPUs at the end of a day, the last six hours' panel took 1.03 s against 0.21 s
before any hour of the day was packed (benchmarks/scale_out.py --only openreads).

Revision ID: 0027
Revises: 0026
Create Date: 2026-12-06
"""
from typing import Sequence, Union

from alembic import op

revision: str = '0027'
down_revision: Union[str, Sequence[str], None] = '0026'
branch_labels: Union[str, Sequence[str], None] = None
depends_on: Union[str, Sequence[str], None] = None


def upgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    op.execute("CREATE INDEX ix_gpu_sample_packed_hour ON gpu_sample_packed (hour)")


def downgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    op.execute("DROP INDEX ix_gpu_sample_packed_hour")
