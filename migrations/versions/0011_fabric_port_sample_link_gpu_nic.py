"""fabric: InfiniBand/RoCE port samples, topology links, GPU-NIC pairing

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-02
"""
from typing import Sequence, Union

from alembic import op
import sqlalchemy as sa
from fleetscope.store.schema import UTCDateTime

revision: str = '0011'
down_revision: Union[str, Sequence[str], None] = '0010'
branch_labels: Union[str, Sequence[str], None] = None
depends_on: Union[str, Sequence[str], None] = None


def upgrade() -> None:
    op.create_table('fabric_port_sample',
    sa.Column('ts', UTCDateTime(), nullable=False),
    sa.Column('node', sa.Text(), nullable=False, comment='the host for host-side readers (sysfs, node_exporter), the node GUID 0x... for fabric-side ones (perfquery by GUID), lid:<n> when only the LID is known'),
    sa.Column('device', sa.Text(), nullable=False, comment='HCA name (mlx5_0); empty for fabric-side readers'),
    sa.Column('port', sa.BigInteger(), nullable=False),
    sa.Column('host', sa.Text(), nullable=True),
    sa.Column('node_guid', sa.Text(), nullable=True, comment='0x-prefixed, 16 hex digits'),
    sa.Column('lid', sa.BigInteger(), nullable=True),
    sa.Column('link_layer', sa.Text(), nullable=True, comment='InfiniBand or Ethernet (RoCE)'),
    sa.Column('state', sa.Text(), nullable=True, comment='ACTIVE, DOWN, INIT, ARMED, ...'),
    sa.Column('phys_state', sa.Text(), nullable=True, comment='LinkUp, Polling, Disabled, ...'),
    sa.Column('width', sa.Text(), nullable=True, comment='lanes: 1X, 2X, 4X, 8X, 12X'),
    sa.Column('speed', sa.Text(), nullable=True, comment='SDR, DDR, QDR, FDR10, FDR, EDR, HDR, NDR, XDR'),
    sa.Column('rate_gbps', sa.Double(), nullable=True, comment="the port's data rate in Gb/s (1e9 bit/s), e.g. 200 for 4X HDR"),
    sa.Column('xmit_bytes_total', sa.BigInteger(), nullable=True, comment='PortXmitData x 4 (the counter is in 4-octet words)'),
    sa.Column('rcv_bytes_total', sa.BigInteger(), nullable=True, comment='PortRcvData x 4'),
    sa.Column('xmit_packets_total', sa.BigInteger(), nullable=True, comment='PortXmitPkts'),
    sa.Column('rcv_packets_total', sa.BigInteger(), nullable=True, comment='PortRcvPkts'),
    sa.Column('unicast_xmit_packets_total', sa.BigInteger(), nullable=True, comment='PortUnicastXmitPkts'),
    sa.Column('unicast_rcv_packets_total', sa.BigInteger(), nullable=True, comment='PortUnicastRcvPkts'),
    sa.Column('multicast_xmit_packets_total', sa.BigInteger(), nullable=True, comment='PortMulticastXmitPkts'),
    sa.Column('multicast_rcv_packets_total', sa.BigInteger(), nullable=True, comment='PortMulticastRcvPkts'),
    sa.Column('symbol_errors_total', sa.BigInteger(), nullable=True, comment='SymbolErrorCounter (16 bits in PortCounters)'),
    sa.Column('link_error_recovery_total', sa.BigInteger(), nullable=True, comment='LinkErrorRecoveryCounter (8 bits)'),
    sa.Column('link_downed_total', sa.BigInteger(), nullable=True, comment='LinkDownedCounter (8 bits)'),
    sa.Column('rcv_errors_total', sa.BigInteger(), nullable=True, comment='PortRcvErrors'),
    sa.Column('rcv_remote_physical_errors_total', sa.BigInteger(), nullable=True, comment='PortRcvRemotePhysicalErrors'),
    sa.Column('rcv_switch_relay_errors_total', sa.BigInteger(), nullable=True, comment='PortRcvSwitchRelayErrors'),
    sa.Column('xmit_discards_total', sa.BigInteger(), nullable=True, comment='PortXmitDiscards'),
    sa.Column('rcv_discards_total', sa.BigInteger(), nullable=True, comment='port_rcv_discards (mlx4 sysfs)'),
    sa.Column('xmit_constraint_errors_total', sa.BigInteger(), nullable=True, comment='PortXmitConstraintErrors'),
    sa.Column('rcv_constraint_errors_total', sa.BigInteger(), nullable=True, comment='PortRcvConstraintErrors'),
    sa.Column('local_link_integrity_errors_total', sa.BigInteger(), nullable=True, comment='LocalLinkIntegrityErrors'),
    sa.Column('excessive_buffer_overrun_errors_total', sa.BigInteger(), nullable=True, comment='ExcessiveBufferOverrunErrors'),
    sa.Column('vl15_dropped_total', sa.BigInteger(), nullable=True, comment='VL15Dropped'),
    sa.Column('qp1_dropped_total', sa.BigInteger(), nullable=True, comment='QP1Dropped'),
    sa.Column('xmit_wait_total', sa.BigInteger(), nullable=True, comment='PortXmitWait: ticks with data to send but none sent (32 bits in PortCounters)'),
    sa.Column('rcv_local_physical_errors_total', sa.BigInteger(), nullable=True, comment='PortRcvErrorDetails: PortLocalPhysicalErrors'),
    sa.Column('rcv_malformed_packet_errors_total', sa.BigInteger(), nullable=True, comment='PortRcvErrorDetails: PortMalformedPktErrors'),
    sa.Column('rcv_buffer_overrun_errors_total', sa.BigInteger(), nullable=True, comment='PortRcvErrorDetails: PortBufferOverrunErrors'),
    sa.Column('rcv_dlid_mapping_errors_total', sa.BigInteger(), nullable=True, comment='PortRcvErrorDetails: PortDLIDMappingErrors'),
    sa.Column('rcv_vl_mapping_errors_total', sa.BigInteger(), nullable=True, comment='PortRcvErrorDetails: PortVLMappingErrors'),
    sa.Column('rcv_looping_errors_total', sa.BigInteger(), nullable=True, comment='PortRcvErrorDetails: PortLoopingErrors'),
    sa.Column('roce_adp_retrans_total', sa.BigInteger(), nullable=True, comment='hw_counters/roce_adp_retrans'),
    sa.Column('roce_adp_retrans_to_total', sa.BigInteger(), nullable=True, comment='hw_counters/roce_adp_retrans_to'),
    sa.Column('roce_slow_restart_total', sa.BigInteger(), nullable=True, comment='hw_counters/roce_slow_restart'),
    sa.Column('roce_slow_restart_cnps_total', sa.BigInteger(), nullable=True, comment='hw_counters/roce_slow_restart_cnps'),
    sa.Column('out_of_buffer_total', sa.BigInteger(), nullable=True, comment='hw_counters/out_of_buffer: packets dropped for lack of receive WQEs'),
    sa.Column('out_of_sequence_total', sa.BigInteger(), nullable=True, comment='hw_counters/out_of_sequence'),
    sa.Column('packet_seq_err_total', sa.BigInteger(), nullable=True, comment='hw_counters/packet_seq_err'),
    sa.Column('local_ack_timeout_err_total', sa.BigInteger(), nullable=True, comment='hw_counters/local_ack_timeout_err'),
    sa.Column('rnr_nak_retry_err_total', sa.BigInteger(), nullable=True, comment='hw_counters/rnr_nak_retry_err'),
    sa.Column('implied_nak_seq_err_total', sa.BigInteger(), nullable=True, comment='hw_counters/implied_nak_seq_err'),
    sa.Column('duplicate_request_total', sa.BigInteger(), nullable=True, comment='hw_counters/duplicate_request'),
    sa.Column('req_cqe_error_total', sa.BigInteger(), nullable=True, comment='hw_counters/req_cqe_error'),
    sa.Column('resp_cqe_error_total', sa.BigInteger(), nullable=True, comment='hw_counters/resp_cqe_error'),
    sa.Column('np_cnp_sent_total', sa.BigInteger(), nullable=True, comment='hw_counters/np_cnp_sent (RoCE congestion notifications sent)'),
    sa.Column('rp_cnp_handled_total', sa.BigInteger(), nullable=True, comment='hw_counters/rp_cnp_handled'),
    sa.Column('np_ecn_marked_roce_packets_total', sa.BigInteger(), nullable=True, comment='hw_counters/np_ecn_marked_roce_packets'),
    sa.Column('source', sa.Text(), nullable=True),
    sa.PrimaryKeyConstraint('node', 'device', 'port', 'ts', name=op.f('pk_fabric_port_sample')),
    comment='One InfiniBand/RoCE port at one instant: cumulative counters, width, speed and state.'
    )
    with op.batch_alter_table('fabric_port_sample', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_fabric_port_sample_ts'), ['ts'], unique=False)

    op.create_table('fabric_link',
    sa.Column('a_node', sa.Text(), nullable=False, comment='node GUID (0x...) of end A, or the host name of a placement row'),
    sa.Column('a_port', sa.BigInteger(), nullable=False),
    sa.Column('a_kind', sa.Text(), nullable=True, comment='CA (HCA), SW (switch), or host (a placement row from node features)'),
    sa.Column('a_desc', sa.Text(), nullable=True, comment='node description, trimmed'),
    sa.Column('a_lid', sa.BigInteger(), nullable=True),
    sa.Column('a_host', sa.Text(), nullable=True, comment='the host of an HCA end (first word of its description)'),
    sa.Column('b_node', sa.Text(), nullable=True, comment='node GUID of end B; null for an unconnected port'),
    sa.Column('b_port', sa.BigInteger(), nullable=True),
    sa.Column('b_kind', sa.Text(), nullable=True),
    sa.Column('b_desc', sa.Text(), nullable=True),
    sa.Column('b_lid', sa.BigInteger(), nullable=True),
    sa.Column('b_host', sa.Text(), nullable=True),
    sa.Column('width', sa.Text(), nullable=True, comment='lanes: 1X, 4X, ...'),
    sa.Column('speed', sa.Text(), nullable=True, comment='SDR ... XDR'),
    sa.Column('rate_gbps', sa.Double(), nullable=True, comment='width x per-lane data rate, Gb/s'),
    sa.Column('connected', sa.Boolean(), nullable=True, comment='false for a port with no peer (not a slow link)'),
    sa.Column('island', sa.Text(), nullable=True, comment='IB island / spine group of a placement row'),
    sa.Column('observed_at', UTCDateTime(), nullable=True),
    sa.Column('source', sa.Text(), nullable=True),
    sa.PrimaryKeyConstraint('a_node', 'a_port', name=op.f('pk_fabric_link')),
    comment='Fabric topology: one row per link (listed once, HCA end first), per unconnected port, or per host-to-leaf placement.'
    )
    with op.batch_alter_table('fabric_link', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_fabric_link_a_host'), ['a_host'], unique=False)
        batch_op.create_index(batch_op.f('ix_fabric_link_b_node_b_port'), ['b_node', 'b_port'], unique=False)

    op.create_table('fabric_gpu_nic',
    sa.Column('host', sa.Text(), nullable=False, comment='empty for a topology that describes a machine type, not one host'),
    sa.Column('gpu_bus_id', sa.Text(), nullable=False),
    sa.Column('nic_bus_id', sa.Text(), nullable=False),
    sa.Column('path', sa.Text(), nullable=True, comment='PIX (same PCIe switch), NODE (same NUMA node), SYS (across NUMA nodes)'),
    sa.Column('pcie_switch', sa.Text(), nullable=True, comment='bus id of the shared PCIe switch (PIX)'),
    sa.Column('numa_node', sa.BigInteger(), nullable=True),
    sa.Column('link_gts', sa.Double(), nullable=True, comment='PCIe link speed of the GPU, GT/s'),
    sa.Column('link_width', sa.BigInteger(), nullable=True, comment='PCIe lanes of the GPU'),
    sa.Column('source', sa.Text(), nullable=True),
    sa.PrimaryKeyConstraint('host', 'gpu_bus_id', 'nic_bus_id', name=op.f('pk_fabric_gpu_nic')),
    comment='Which NIC each GPU reaches best over PCIe (NCCL topology), one row per nearest GPU-NIC pair.'
    )


def downgrade() -> None:
    op.drop_table('fabric_gpu_nic')
    with op.batch_alter_table('fabric_link', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_fabric_link_a_host'))
        batch_op.drop_index(batch_op.f('ix_fabric_link_b_node_b_port'))
    op.drop_table('fabric_link')
    with op.batch_alter_table('fabric_port_sample', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_fabric_port_sample_ts'))
    op.drop_table('fabric_port_sample')
