"""Fleetscope service kernel: settings, schema, store, api, worker, alerting, cli, sim."""
__version__ = "0.1.0"
