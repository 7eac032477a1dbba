"""job analysis state: what an incremental job analysis has folded so far and the watermarks it reads on from
(fleetscope/services/job_fold.py)

Revision ID: 0019
Revises: 0018
Create Date: 2026-12-05
"""
from typing import Sequence, Union

from alembic import op
import sqlalchemy as sa
from fleetscope.store.schema import UTCDateTime

revision: str = '0019'
down_revision: Union[str, Sequence[str], None] = '0018'
branch_labels: Union[str, Sequence[str], None] = None
depends_on: Union[str, Sequence[str], None] = None


def upgrade() -> None:
    op.create_table('job_analysis_state',
    sa.Column('job_id', sa.Text(), nullable=False),
    sa.Column('analyzer', sa.String(length=40), nullable=False, comment='whose state: steps (C3, stragglers, program goodput)'),
    sa.Column('state', sa.Text(), nullable=False, comment='JSON: watermarks and the folded partial results'),
    sa.Column('updated_at', UTCDateTime(), nullable=False, comment='the analysis time of the run that wrote it'),
    sa.PrimaryKeyConstraint('job_id', 'analyzer', name=op.f('pk_job_analysis_state')),
    comment='Folded partial results of incremental job analyses (services/job_fold.py).'
    )


def downgrade() -> None:
    op.drop_table('job_analysis_state')
