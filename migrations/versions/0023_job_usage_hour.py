"""job_usage_hour: each scheduler job's GPU utilisation and power per hour, rolled from the hour tier

A month of team costs (the Teams & Cost page, the showback, the budget check) read the hour tier of every GPU a
job held: 11.8 M rows for a 16,384-GPU fleet, 16-19 s a page on the 2-core reference machine. A row per job and
hour it ran carries the same sums (services/job_usage.py).

Revision ID: 0023
Revises: 0022
Create Date: 2026-12-06
"""
from typing import Sequence, Union

from alembic import op
import sqlalchemy as sa
from fleetscope.store.schema import UTCDateTime

revision: str = '0023'
down_revision: Union[str, Sequence[str], None] = '0022'
branch_labels: Union[str, Sequence[str], None] = None
depends_on: Union[str, Sequence[str], None] = None


def upgrade() -> None:
    op.create_table('job_usage_hour',
    sa.Column('bucket', UTCDateTime(), nullable=False, comment='start of the UTC hour'),
    sa.Column('cluster', sa.Text(), nullable=False),
    sa.Column('job_id', sa.Text(), nullable=False),
    sa.Column('gpus', sa.BigInteger(), nullable=False, comment='GPUs telemetry names for the job when the hour was rolled'),
    sa.Column('util_weighted', sa.Double(), nullable=False, comment="sum over its GPUs of the hour's mean util_ratio x its samples"),
    sa.Column('util_samples', sa.Double(), nullable=False, comment='samples under util_weighted (those with a util_ratio)'),
    sa.Column('power_weighted', sa.Double(), nullable=False, comment="sum over its GPUs of the hour's mean power_w x its samples"),
    sa.Column('power_samples', sa.Double(), nullable=False, comment='samples under power_weighted (those with a power_w)'),
    sa.Column('power_gpus', sa.BigInteger(), nullable=False, comment='GPUs of the job with a power reading in the hour'),
    sa.PrimaryKeyConstraint('cluster', 'job_id', 'bucket', name=op.f('pk_job_usage_hour')),
    comment="Per scheduler job and UTC hour it held GPUs in, its GPUs' hour-tier utilisation and power summed with their sample weights: a month of team costs reads a row per job-hour, not every GPU's hours (services/job_usage.py)."
    )
    with op.batch_alter_table('job_usage_hour', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_job_usage_hour_bucket'), ['bucket'], unique=False)
    with op.batch_alter_table('rollup_watermark', schema=None) as batch_op:
        batch_op.alter_column('tier', existing_type=sa.String(length=40), existing_nullable=False,
                              comment='minute, hour, or job_hour (services/job_usage.py)', existing_comment='minute or hour')


def downgrade() -> None:
    with op.batch_alter_table('rollup_watermark', schema=None) as batch_op:
        batch_op.alter_column('tier', existing_type=sa.String(length=40), existing_nullable=False,
                              comment='minute or hour', existing_comment='minute, hour, or job_hour (services/job_usage.py)')
    with op.batch_alter_table('job_usage_hour', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_job_usage_hour_bucket'))
    op.drop_table('job_usage_hour')
