"""metric_sample without its foreign key to series

PostgreSQL checks a foreign key row by row (a trigger that reads and share-locks the series row of each
sample): the COPY of a 16,384-GPU scrape's 32,768 metric samples cost its backend 0.24 CPU-s with the key and
0.085 without, in the store's write (0.19 against 0.09 for a bare COPY), the largest part of its work per
scrape (benchmarks/ingest.py). The store is the only writer
of both tables and takes every series id from `series` in the sample's own transaction (or from ids it saw
committed); series rows are never deleted, so the key's ON DELETE CASCADE never fired either.

Revision ID: 0022
Revises: 0021
Create Date: 2026-12-05
"""
from typing import Sequence, Union

from alembic import op

revision: str = '0022'
down_revision: Union[str, Sequence[str], None] = '0021'
branch_labels: Union[str, Sequence[str], None] = None
depends_on: Union[str, Sequence[str], None] = None

FK = "fk_metric_sample_series_id_series"


def upgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        # On the partitioned parent: its partitions' copies of the key go with it.
        op.execute(f'ALTER TABLE metric_sample DROP CONSTRAINT IF EXISTS "{FK}"')
        return
    with op.batch_alter_table("metric_sample", recreate="always") as batch_op:
        batch_op.drop_constraint(FK, type_="foreignkey")


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute(f'ALTER TABLE metric_sample ADD CONSTRAINT "{FK}" FOREIGN KEY (series_id) REFERENCES series (series_id) ON DELETE CASCADE')
        return
    with op.batch_alter_table("metric_sample", recreate="always") as batch_op:
        batch_op.create_foreign_key(FK, "series", ["series_id"], ["series_id"], ondelete="CASCADE")
