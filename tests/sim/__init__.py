"""Tests of the fleet simulator (fleetscope.sim)."""
