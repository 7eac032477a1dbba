"""beat's leader lease and shared schedule state; the DCGM fault-counter readings shared by every writing process

Revision ID: 0018
Revises: 0017
Create Date: 2026-12-05
"""
from typing import Sequence, Union

from alembic import op
import sqlalchemy as sa
from fleetscope.store.schema import UTCDateTime

revision: str = '0018'
down_revision: Union[str, Sequence[str], None] = '0017'
branch_labels: Union[str, Sequence[str], None] = None
depends_on: Union[str, Sequence[str], None] = None


def upgrade() -> None:
    op.create_table('beat_lease',
    sa.Column('name', sa.String(length=40), nullable=False, comment='the schedule the lease is for'),
    sa.Column('holder', sa.String(length=200), nullable=False, comment='host:pid:nonce of the beat that holds it'),
    sa.Column('expires_at', UTCDateTime(), nullable=False, comment='the holder leads until this instant unless it renews'),
    sa.Column('acquired_at', UTCDateTime(), nullable=False, comment='when this holder took the lease'),
    sa.PrimaryKeyConstraint('name', name=op.f('pk_beat_lease')),
    comment="Leader lease of beat's schedule: one row per schedule, held by one beat at a time."
    )
    op.create_table('beat_entry',
    sa.Column('name', sa.String(length=200), nullable=False, comment='the beat_schedule entry'),
    sa.Column('last_run_at', UTCDateTime(), nullable=False),
    sa.Column('total_run_count', sa.BigInteger(), nullable=False),
    sa.PrimaryKeyConstraint('name', name=op.f('pk_beat_entry')),
    comment='Last send of each beat schedule entry, written by the leading beat.'
    )
    op.create_table('counter_reading',
    sa.Column('gpu_uuid', sa.Text(), nullable=False),
    sa.Column('code', sa.BigInteger(), nullable=False, comment='DCGM field id of the counter'),
    sa.Column('value', sa.Double(), nullable=True, comment='the newest reading'),
    sa.Column('version', sa.BigInteger(), nullable=False, comment='the change that wrote this reading, increasing'),
    sa.PrimaryKeyConstraint('gpu_uuid', 'code', name=op.f('pk_counter_reading')),
    comment="Last reading of each GPU's DCGM fault counters, shared by the writing processes."
    )
    op.create_index(op.f('ix_counter_reading_version'), 'counter_reading', ['version'], unique=False)


def downgrade() -> None:
    op.drop_index(op.f('ix_counter_reading_version'), table_name='counter_reading')
    op.drop_table('counter_reading')
    op.drop_table('beat_entry')
    op.drop_table('beat_lease')
