"""Domain services: one module per domain, owning its writes, its reads (shared by the API, the CLI and
the dashboard) and its typed errors."""
