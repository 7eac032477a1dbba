"""gpu_sample.vgpu_license_status: dcgm-exporter's default DCGM_FI_DEV_VGPU_LICENSE_STATUS as a column

Every dcgm-exporter with its default counters exports the field for every GPU. Without a column each GPU was a
series of its own in ``metric_sample``: 8 series and 8 rows a node's push, 16,384 rows a 16,384-GPU scrape (on
PostgreSQL a quarter of the database's time for that scrape). The column comes to ``gpu_sample``, its roll-up
tiers and, on PostgreSQL, the packed layout. Rows already stored as series stay where they are.

Revision ID: 0029
Revises: 0028
Create Date: 2026-12-07
"""
from typing import Sequence, Union

from migrations import gpu_field

revision: str = '0029'
down_revision: Union[str, Sequence[str], None] = '0028'
branch_labels: Union[str, Sequence[str], None] = None
depends_on: Union[str, Sequence[str], None] = None

FIELD = "vgpu_license_status"


def upgrade() -> None:
    gpu_field.add(FIELD, integer=True, comment="DCGM_FI_DEV_VGPU_LICENSE_STATUS, as exported (0 on a GPU that is not a licensed vGPU)")


def downgrade() -> None:
    gpu_field.drop(FIELD)
