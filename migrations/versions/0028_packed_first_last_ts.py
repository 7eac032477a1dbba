"""gpu_sample_packed: each GPU-hour's first and last sample time (PostgreSQL)

The oldest sample held (``data_start``, the start of a fleet panel, a tier's oldest instant) is the smallest
first timestamp of the oldest packed hour, and the newest, when every hour is packed, the largest last one of the
newest. Read from the arrays, every GPU's timestamps in that hour were detoasted: 33 ms over 2,048 GPUs, asked
twice by each fleet panel. Two plain columns answer from the rows alone. Rows packed before this revision hold
NULL there: reads fall back to the arrays for them, and beat's packing tick fills the oldest and newest hour's
(``services.packing``), so an upgrade rewrites nothing at once.

Revision ID: 0028
Revises: 0027
Create Date: 2026-12-06
"""
from typing import Sequence, Union

from alembic import op

revision: str = '0028'
down_revision: Union[str, Sequence[str], None] = '0027'
branch_labels: Union[str, Sequence[str], None] = None
depends_on: Union[str, Sequence[str], None] = None


def upgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    op.execute("ALTER TABLE gpu_sample_packed ADD COLUMN first_ts timestamptz, ADD COLUMN last_ts timestamptz")
    op.execute("COMMENT ON COLUMN gpu_sample_packed.first_ts IS 'ts[1]: the GPU-hour''s first sample time (NULL where packed before 0028)'")
    op.execute("COMMENT ON COLUMN gpu_sample_packed.last_ts IS 'the GPU-hour''s last sample time (NULL where packed before 0028)'")


def downgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    op.execute("ALTER TABLE gpu_sample_packed DROP COLUMN first_ts, DROP COLUMN last_ts")
