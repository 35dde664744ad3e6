"""A real Prometheus server for tests (reusable: see prometheus_server.py and fixtures.py)."""
