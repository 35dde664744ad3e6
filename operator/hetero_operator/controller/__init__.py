"""The Kubernetes side: kopf registrations, the reconciler (a work queue over kopf's watches), the
API client, requeue, leadership, events, progress, reservations and the operator's metrics."""
