"""The planner: eligible pools, the plan, images, batch split, memory model, marginal value and
learned speeds (pure; imports ``api`` and ``cluster``, no kopf, no API client)."""
