"""What happens next to a job: the decisions from its status, pods and nodes, and its status
(pure; no kopf, no API client)."""
