"""api token bindings

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-01
"""
from typing import Sequence, Union

from alembic import op
import sqlalchemy as sa

revision: str = '0010'
down_revision: Union[str, Sequence[str], None] = '0009'
branch_labels: Union[str, Sequence[str], None] = None
depends_on: Union[str, Sequence[str], None] = None


def upgrade() -> None:
    # Existing tokens stay unbound (null), as they were.
    with op.batch_alter_table('api_token', schema=None) as batch_op:
        batch_op.add_column(sa.Column('bound_site', sa.String(length=200), nullable=True, comment='pushes may name only this site (null: any)'))
        batch_op.add_column(sa.Column('bound_host', sa.String(length=500), nullable=True, comment='pushes may name only this host (null: any)'))
        batch_op.add_column(sa.Column('bound_source', sa.String(length=2000), nullable=True, comment='pushes must claim this source (null: any)'))


def downgrade() -> None:
    with op.batch_alter_table('api_token', schema=None) as batch_op:
        batch_op.drop_column('bound_source')
        batch_op.drop_column('bound_host')
        batch_op.drop_column('bound_site')
