"""Tests of the pure protocol core (coordinator_svc/core)."""
