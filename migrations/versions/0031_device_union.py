"""device_union: each Kineto trace's device timeline reduced to the unions of HTA's temporal breakdown

Meta's Holistic Trace Analysis reports per rank the idle, compute and non-compute time of the GPU and how much of
its communication ran under computation; analyzers.c3 reproduces its figures to the µs, but only from a trace
held in memory, and the store kept the step and collective frames alone. The Kineto reader now reduces each
rank's device events per HTA event window to six numbers (fleetscope/core/kernels.py), three rows a trace, from
which the ``temporal`` job analysis makes HTA's figures (services/jobs.py). Traces ingested before this revision
have no rows: ingest them again to have their breakdown.

Revision ID: 0031
Revises: 0030
Create Date: 2026-12-08
"""
from typing import Sequence, Union

from alembic import op
import sqlalchemy as sa
from fleetscope.store.schema import UTCDateTime

revision: str = '0031'
down_revision: Union[str, Sequence[str], None] = '0030'
branch_labels: Union[str, Sequence[str], None] = None
depends_on: Union[str, Sequence[str], None] = None


def _text() -> sa.types.TypeEngine:
    # every string column is compared by its bytes on PostgreSQL (0024, store/sqltypes.py byte_ordered_strings)
    return sa.Text().with_variant(sa.Text(collation="C"), "postgresql")


def upgrade() -> None:
    op.create_table('device_union',
    sa.Column('job_id', _text(), nullable=False),
    sa.Column('rank', sa.BigInteger(), nullable=False),
    sa.Column('start', UTCDateTime(), nullable=False, comment="the trace's first device event, rounded up to the µs: which of the rank's traces"),
    sa.Column('window', _text(), nullable=False, comment="HTA's event window: all, before_last_step (HTA's default) or through_last_step"),
    sa.Column('events', sa.BigInteger(), nullable=False, comment='device events the window keeps'),
    sa.Column('span_us', sa.Double(), nullable=False, comment="HTA's kernel time: end of the last merged block minus start of the first"),
    sa.Column('busy_us', sa.Double(), nullable=False, comment='union of the kept device events (kernel time minus idle)'),
    sa.Column('compute_us', sa.Double(), nullable=False, comment="union of HTA's COMPUTATION kernels"),
    sa.Column('comm_us', sa.Double(), nullable=False, comment="union of HTA's COMMUNICATION (NCCL) kernels"),
    sa.Column('overlap_us', sa.Double(), nullable=False, comment='time a communication block and a computation block are both open'),
    sa.Column('step_min', sa.BigInteger(), nullable=True, comment='lowest N of the ProfilerStep#N the trace names; null when it names none'),
    sa.Column('step_max', sa.BigInteger(), nullable=True, comment='highest N of the ProfilerStep#N the trace names'),
    sa.PrimaryKeyConstraint('job_id', 'rank', 'start', 'window', name=op.f('pk_device_union')),
    comment="One rank's device timeline in one Kineto trace over one of HTA's event windows, reduced to the unions "
            "HTA's temporal breakdown and communication/computation overlap are made of (fleetscope.core.kernels)."
    )
    with op.batch_alter_table('device_union', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_device_union_start'), ['start'], unique=False)


def downgrade() -> None:
    with op.batch_alter_table('device_union', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_device_union_start'))

    op.drop_table('device_union')
