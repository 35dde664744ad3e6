"""A plan as Kubernetes objects: pods and the headless Service, the rank environments, the
NetworkPolicy, Kueue's Workload and the DRA claim templates (pure: dicts in, dicts out)."""
