"""RBAC for the integrations of issue 15: DRA (read ResourceSlices/ResourceClaims cluster-wide,
write ResourceClaimTemplates where jobs live) and Kueue (Workloads and their status where jobs
live, ResourceFlavors and PriorityClasses read cluster-wide)."""

from __future__ import annotations

from test_chart import grants, objects, one


def test_cluster_scope_reads_dra_and_writes_claim_templates() -> None:
    role = one("default", "ClusterRole")
    for resource in ("resourceslices", "resourceclaims"):
        for verb in ("get", "list", "watch"):
            assert grants(role, "resource.k8s.io", resource, verb), (resource, verb)
        assert not grants(role, "resource.k8s.io", resource, "create")
    for verb in ("get", "create", "delete"):
        assert grants(role, "resource.k8s.io", "resourceclaimtemplates", verb)


def test_namespaced_scope_writes_claim_templates_only_in_watched_namespaces() -> None:
    scenario = "namespaced-values.yaml"
    cluster_role = one(scenario, "ClusterRole")
    assert grants(cluster_role, "resource.k8s.io", "resourceslices", "list")
    assert not grants(cluster_role, "resource.k8s.io", "resourceclaimtemplates", "create")
    for role in objects(scenario, kind="Role"):
        assert grants(role, "resource.k8s.io", "resourceclaimtemplates", "create")


def test_kueue_rules() -> None:
    role = one("default", "ClusterRole")
    for verb in ("get", "list", "watch", "create", "patch"):  # patch: spec.active (suspend)
        assert grants(role, "kueue.x-k8s.io", "workloads", verb)
    assert grants(role, "kueue.x-k8s.io", "workloads/status", "patch")
    assert not grants(role, "kueue.x-k8s.io", "workloads", "delete")  # owner references do that
    assert grants(role, "kueue.x-k8s.io", "resourceflavors", "list")
    assert not grants(role, "kueue.x-k8s.io", "resourceflavors", "create")
    assert grants(role, "scheduling.k8s.io", "priorityclasses", "get")
    namespaced = "namespaced-values.yaml"
    assert not grants(one(namespaced, "ClusterRole"), "kueue.x-k8s.io", "workloads", "create")
    for r in objects(namespaced, kind="Role"):
        assert grants(r, "kueue.x-k8s.io", "workloads/status", "patch")
