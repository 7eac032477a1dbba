"""gpu_sample.nvlink_throughput_raw: dcgm-exporter's default DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL as a column

The last field of dcgm-exporter's default counters without a column: each GPU was a series of its own in
``metric_sample``, 8 series and 8 rows a node's push and 16,384 rows a 16,384-GPU scrape, and a node's first push
created its 8 series. The value is kept as exported (DCGM states no unit for field 449), so the column is ``_raw``.
It comes to ``gpu_sample``, its roll-up tiers and, on PostgreSQL, the packed layout. Rows already stored as series
stay where they are.

Revision ID: 0030
Revises: 0029
Create Date: 2026-12-07
"""
from typing import Sequence, Union

from migrations import gpu_field

revision: str = '0030'
down_revision: Union[str, Sequence[str], None] = '0029'
branch_labels: Union[str, Sequence[str], None] = None
depends_on: Union[str, Sequence[str], None] = None

FIELD = "nvlink_throughput_raw"


def upgrade() -> None:
    gpu_field.add(FIELD, integer=False, comment="DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL (field 449, NVLINK_THROUGHPUT_TOTAL in newer DCGM), as exported")


def downgrade() -> None:
    gpu_field.drop(FIELD)
