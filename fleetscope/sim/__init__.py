"""Fleet simulator: fleets of any size whose telemetry the demo, tests and benchmarks ingest.

This first piece builds inventory and GPU samples directly as canonical frames; the full simulator
(Fleet Law jobs, injected faults, real output formats) grows here.
"""

from fleetscope.sim.fleet import FleetSpec, gpu_fleet

__all__ = ["FleetSpec", "gpu_fleet"]
