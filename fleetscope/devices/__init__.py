"""What talks to GPUs and their driver on a host: NVML readings and the SDC probe's device run. The
mappings and checks they feed are pure (``ingest.nvml``, ``analyzers.sdc``)."""
