"""Tests against the real control plane (docs/cluster.md)."""
