"""Fleet simulator: fleets of any size whose telemetry the demo, tests and benchmarks ingest.

``gpu_fleet`` builds inventory and GPU samples directly as canonical frames (quick fixtures).
``simulate`` runs a whole fleet — Fleet Law jobs, injected faults, facility meters, lineage, predictions —
and writes it in the real formats (dcgm-exporter text, NCCL Inspector JSON Lines, Kineto traces, job
events, OTLP/JSON, OpenLineage), so everything downstream goes through the real parsers.
"""

from fleetscope.sim.faults import InjectedFault
from fleetscope.sim.fleet import FleetSpec, Topology, build_topology, gpu_fleet
from fleetscope.sim.jobs import fleet_law, ring_allreduce_s, ring_reduce_scatter_s
from fleetscope.sim.simulate import Manifest, simulate, simulate_demo, simulate_small
from fleetscope.sim.spec import GPU_MODELS, FaultSpec, GpuModel, JobSpec, SimSpec, demo_spec, small_spec

__all__ = [
    "FleetSpec", "gpu_fleet", "Topology", "build_topology",
    "SimSpec", "JobSpec", "FaultSpec", "GpuModel", "GPU_MODELS", "small_spec", "demo_spec",
    "simulate", "simulate_small", "simulate_demo", "Manifest", "InjectedFault",
    "fleet_law", "ring_allreduce_s", "ring_reduce_scatter_s",
]
