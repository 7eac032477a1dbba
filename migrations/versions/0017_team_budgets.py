"""team budgets: a team's monthly GPU-hour quota and/or money budget, recorded with who and when

Revision ID: 0017
Revises: 0016
Create Date: 2026-12-05
"""
from typing import Sequence, Union

from alembic import op
import sqlalchemy as sa
from fleetscope.store.schema import UTCDateTime

revision: str = '0017'
down_revision: Union[str, Sequence[str], None] = '0016'
branch_labels: Union[str, Sequence[str], None] = None
depends_on: Union[str, Sequence[str], None] = None


def upgrade() -> None:
    op.create_table('team_budget',
    sa.Column('team', sa.Text(), nullable=False),
    sa.Column('month', sa.Text(), nullable=False, comment='YYYY-MM it holds for; empty: every month without its own row'),
    sa.Column('gpu_hour_quota', sa.Double(), nullable=True, comment='GPU-hours allocated the team may use in the month (null: no quota)'),
    sa.Column('budget', sa.Double(), nullable=True, comment='money the team may spend in the month, in currency (null: no money budget)'),
    sa.Column('currency', sa.Text(), nullable=True, comment='ISO 4217 code of budget, e.g. EUR'),
    sa.Column('recorded_by', sa.Text(), nullable=False),
    sa.Column('recorded_at', UTCDateTime(), nullable=False),
    sa.PrimaryKeyConstraint('team', 'month', name=op.f('pk_team_budget')),
    comment="A team's monthly GPU-hour quota and/or money budget (set through the API, recorded with who and when)."
    )


def downgrade() -> None:
    op.drop_table('team_budget')
