"""gpu inventory change counter: a trigger advances it for every gpu row inserted, updated or deleted, so a
process can skip the upsert of an inventory it found stored while the counter stays (fleetscope/store/inventory.py)

Revision ID: 0020
Revises: 0019
Create Date: 2026-12-05
"""
from typing import Sequence, Union

from alembic import op
import sqlalchemy as sa

revision: str = '0020'
down_revision: Union[str, Sequence[str], None] = '0019'
branch_labels: Union[str, Sequence[str], None] = None
depends_on: Union[str, Sequence[str], None] = None

_EVENTS = ("insert", "update", "delete")


def upgrade() -> None:
    op.create_table('inventory_version',
    sa.Column('name', sa.String(length=40), nullable=False, comment='the inventory table counted: gpu'),
    sa.Column('version', sa.BigInteger(), nullable=False, comment='rows of it changed since the count began'),
    sa.PrimaryKeyConstraint('name', name=op.f('pk_inventory_version')),
    comment='Change counter of the gpu inventory (SQLite; PostgreSQL: the sequence gpu_inventory_version).'
    )
    if op.get_bind().dialect.name == "sqlite":
        # SQLite's writers take turns, so one row counts for all of them.
        op.execute("INSERT INTO inventory_version (name, version) VALUES ('gpu', 0)")
        for event in _EVENTS:
            op.execute(f"CREATE TRIGGER gpu_inventory_{event} AFTER {event.upper()} ON gpu FOR EACH ROW "
                       "BEGIN UPDATE inventory_version SET version = version + 1 WHERE name = 'gpu'; END")
        return
    # PostgreSQL: a sequence, which concurrent writers advance without a row lock to queue on (an UPDATE of one
    # counter row would make every transaction that changes a gpu row wait for the others to commit).
    op.execute("CREATE SEQUENCE gpu_inventory_version")
    op.execute("CREATE FUNCTION gpu_inventory_changed() RETURNS trigger LANGUAGE plpgsql AS "
               "$$ BEGIN PERFORM nextval('gpu_inventory_version'); RETURN NULL; END $$")
    op.execute("CREATE TRIGGER gpu_inventory_rows AFTER INSERT OR UPDATE OR DELETE ON gpu "
               "FOR EACH ROW EXECUTE FUNCTION gpu_inventory_changed()")
    op.execute("CREATE TRIGGER gpu_inventory_truncate AFTER TRUNCATE ON gpu "
               "FOR EACH STATEMENT EXECUTE FUNCTION gpu_inventory_changed()")


def downgrade() -> None:
    if op.get_bind().dialect.name == "sqlite":
        for event in _EVENTS:
            op.execute(f"DROP TRIGGER gpu_inventory_{event}")
    else:
        op.execute("DROP TRIGGER gpu_inventory_truncate ON gpu")
        op.execute("DROP TRIGGER gpu_inventory_rows ON gpu")
        op.execute("DROP FUNCTION gpu_inventory_changed()")
        op.execute("DROP SEQUENCE gpu_inventory_version")
    op.drop_table('inventory_version')
