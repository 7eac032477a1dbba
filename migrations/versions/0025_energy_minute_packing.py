"""gpu_energy_minute_packed: closed days of the per-GPU energy minutes as per-(GPU, hour) arrays (PostgreSQL)

The energy minutes are evidence kept three years by default, and as rows they cost 281 bytes a GPU-minute,
0.40 MB a GPU-day: 45 TB of a 100,000-GPU fleet's 84 TB at the default retentions (README, "Capacity model").
Beat packs each closed day an hour at a time into one row per GPU and hour (store/packed_energy.py,
services/packing.py); every value is kept exactly. Not declared in the models, like gpu_sample_packed:
arrays have no SQLite form, and SQLite never packs.

Revision ID: 0025
Revises: 0024
Create Date: 2026-12-06
"""
from typing import Sequence, Union

from alembic import op
import sqlalchemy as sa

revision: str = '0025'
down_revision: Union[str, Sequence[str], None] = '0024'
branch_labels: Union[str, Sequence[str], None] = None
depends_on: Union[str, Sequence[str], None] = None

ARRAYS = {"energy_j": "double precision[]", "counter_energy_j": "double precision[]", "integrated_energy_j": "double precision[]",
          "covered_s": "double precision[]", "method": "text[]"}


def upgrade() -> None:
    bind = op.get_bind()
    if bind.dialect.name != "postgresql":
        return
    op.execute(
        "CREATE TABLE gpu_energy_minute_packed (\n"
        "    hour timestamptz NOT NULL,\n"
        '    gpu_uuid text COLLATE "C" NOT NULL,\n'
        "    minutes smallint[] NOT NULL,\n"
        + "".join(f'    "{name}" {type_},\n' for name, type_ in ARRAYS.items())
        + "    CONSTRAINT pk_gpu_energy_minute_packed PRIMARY KEY (hour, gpu_uuid))")
    # a job's or a GPU's minutes over a period, as the (gpu_uuid, minute) index serves the rows
    op.execute("CREATE INDEX ix_gpu_energy_minute_packed_gpu_uuid_hour ON gpu_energy_minute_packed (gpu_uuid, hour)")
    op.execute("COMMENT ON TABLE gpu_energy_minute_packed IS 'Closed days of gpu_energy_minute, one row per GPU and UTC hour of"
               " the minutes'' offsets and columns as arrays in minute order (store/packed_energy.py).'")
    lz4 = bind.execute(sa.text("SELECT 'lz4' = ANY(enumvals) FROM pg_settings WHERE name = 'default_toast_compression'")).scalar()
    if lz4:
        op.execute("ALTER TABLE gpu_energy_minute_packed " + ", ".join(f'ALTER COLUMN "{n}" SET COMPRESSION lz4' for n in ["minutes", *ARRAYS]))


def downgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    # the packed minutes back into rows, exactly as they were
    cols = ", ".join(f'"{c}"' for c in ARRAYS)
    unnested = ", ".join(f'unnest(p."{c}") AS "{c}"' for c in ARRAYS)
    op.execute(f"INSERT INTO gpu_energy_minute (minute, gpu_uuid, {cols})"
               f" SELECT u.* FROM (SELECT p.hour + unnest(p.minutes) * INTERVAL '1 minute' AS minute, p.gpu_uuid, {unnested}"
               " FROM gpu_energy_minute_packed p) u ON CONFLICT (minute, gpu_uuid) DO NOTHING")
    op.execute("DROP TABLE gpu_energy_minute_packed")
