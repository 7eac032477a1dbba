"""raw packing: closed days of gpu_sample packed into per-(GPU, hour) rows of column arrays, partitioned by day
(PostgreSQL only; fleetscope/store/packed.py)

Revision ID: 0021
Revises: 0020
Create Date: 2026-12-05
"""
from typing import Sequence, Union

from alembic import op
import sqlalchemy as sa

revision: str = '0021'
down_revision: Union[str, Sequence[str], None] = '0020'
branch_labels: Union[str, Sequence[str], None] = None
depends_on: Union[str, Sequence[str], None] = None

# The field columns as this revision packs them (store/packed.py FLOAT4_FIELDS: real; counters: double; integers: bigint).
COLUMNS = """
    "util_ratio" real[],
    "mem_copy_util_ratio" real[],
    "enc_util_ratio" real[],
    "dec_util_ratio" real[],
    "gr_engine_active_ratio" real[],
    "sm_active_ratio" real[],
    "sm_occupancy_ratio" real[],
    "tensor_active_ratio" real[],
    "fp64_active_ratio" real[],
    "fp32_active_ratio" real[],
    "fp16_active_ratio" real[],
    "dram_active_ratio" real[],
    "fb_used_bytes" bigint[],
    "fb_free_bytes" bigint[],
    "fb_reserved_bytes" bigint[],
    "power_w" real[],
    "energy_j" double precision[],
    "temp_c" real[],
    "mem_temp_c" real[],
    "sm_clock_mhz" real[],
    "mem_clock_mhz" real[],
    "pcie_tx_bytes_per_s" real[],
    "pcie_rx_bytes_per_s" real[],
    "nvlink_tx_bytes_per_s" real[],
    "nvlink_rx_bytes_per_s" real[],
    "pcie_replay_total" bigint[],
    "xid_last" bigint[],
    "ecc_sbe_volatile_total" bigint[],
    "ecc_dbe_volatile_total" bigint[],
    "ecc_sbe_aggregate_total" bigint[],
    "ecc_dbe_aggregate_total" bigint[],
    "retired_sbe_total" bigint[],
    "retired_dbe_total" bigint[],
    "retired_pending_total" bigint[],
    "remap_correctable_total" bigint[],
    "remap_uncorrectable_total" bigint[],
    "remap_failure" bigint[],
    "remap_pending" bigint[],
    "power_violation_s" double precision[],
    "thermal_violation_s" double precision[],
    "clock_event_reasons" bigint[]
"""


def upgrade() -> None:
    bind = op.get_bind()
    if bind.dialect.name != "postgresql":
        return
    op.execute(
        "CREATE TABLE gpu_sample_packed (\n"
        "    hour timestamptz NOT NULL,\n"
        "    gpu_uuid text NOT NULL,\n"
        "    samples integer NOT NULL,\n"
        "    ts timestamptz[] NOT NULL,"
        + COLUMNS +
        ", CONSTRAINT pk_gpu_sample_packed PRIMARY KEY (gpu_uuid, hour)) PARTITION BY RANGE (hour)")
    op.execute("CREATE INDEX ix_gpu_sample_packed_hour_brin ON gpu_sample_packed USING brin (hour)")
    op.execute("COMMENT ON TABLE gpu_sample_packed IS 'Closed days of gpu_sample, one row per GPU and UTC hour of column arrays"
               " in time order (store/packed.py); partitioned by day like gpu_sample.'")
    lz4 = bind.execute(sa.text("SELECT 'lz4' = ANY(enumvals) FROM pg_settings WHERE name = 'default_toast_compression'")).scalar()
    if lz4:
        # lz4 (PostgreSQL 14+, when built with it) stores an array compressed whenever that is smaller at all; pglz
        # gives up on values it cannot shrink by a quarter. Partitions made later inherit a column's compression.
        names = ["ts", *(line.split()[0].strip('"') for line in COLUMNS.strip().splitlines())]
        op.execute("ALTER TABLE gpu_sample_packed " + ", ".join(f'ALTER COLUMN "{n}" SET COMPRESSION lz4' for n in names))


def downgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    # the packed samples back into their raw day partitions (packing leaves those in place, emptied)
    names = [line.split()[0] for line in COLUMNS.strip().splitlines()]
    picked = ", ".join(f"u.{n}::{'bigint' if 'bigint' in line else 'float8'}" for n, line in zip(names, COLUMNS.strip().splitlines()))
    op.execute(f"INSERT INTO gpu_sample (ts, gpu_uuid, {', '.join(names)}) SELECT u.ts, p.gpu_uuid, {picked}"
               f" FROM gpu_sample_packed p CROSS JOIN LATERAL unnest(p.ts, {', '.join('p.' + n for n in names)})"
               f" AS u(ts, {', '.join(names)}) ON CONFLICT DO NOTHING")
    op.execute("DROP TABLE gpu_sample_packed")
