"""Test infrastructure: a Kubernetes API server on kmock, a local kubelet, CRD schema checks."""
