"""Whether a job's NetworkPolicy restricts egress too (``HTJ_NETWORK_POLICY_EGRESS``).

``always`` and ``never`` say it; ``auto`` restricts egress when another policy of the namespace
already isolates any of the job's pods' egress (shared/cases/46: "default deny all"), so that the
job's policy then lets the ranks reach each other and the DNS.
"""

from __future__ import annotations

import logging
from typing import Any

from hetero_operator.api.spec import JobSpec
from hetero_operator.cluster import netpol

log = logging.getLogger("heterotrain.operator")


async def restricts_egress(api: Any, mode: str, spec: JobSpec, pods: list[dict[str, Any]]) -> bool:
    """True when the job's policy must list egress rules.

    Args:
        api: the operator's API client; without ``list_network_policies`` (a test double) or when
            the list is unreadable (RBAC of an older chart), ``auto`` leaves egress as it is (False).
        mode: ``always``, ``never`` or ``auto``.
        spec: the job (its namespace and name; its own policy is ignored).
        pods: the rendered pods (their labels decide which policies select them).
    """
    if mode != "auto":
        return mode == "always"
    lister = getattr(api, "list_network_policies", None)
    if lister is None:
        return False
    try:
        policies = await lister(spec.namespace)
    except Exception as exc:  # noqa: BLE001 - advice only: the policy stays ingress-only
        log.warning("%s: cannot list NetworkPolicies (%s); the job's policy restricts ingress "
                    "only", spec.namespace, exc)
        return False
    return any(netpol.egress_isolated(policies, p["metadata"]["labels"], ignore=spec.name)
               for p in pods)
