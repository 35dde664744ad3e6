"""Whether a job may use a device: allow/deny lists, memory, precision (pure).

Shared by the planner and the unschedulable report.
"""

from __future__ import annotations

from hetero_operator.api import types as model
from hetero_operator.api.spec import JobSpec
from hetero_operator.api.types import Device


def precision_for(policy: str, compute_capability: str) -> str:
    """``spec.training.precision`` -> ``"bf16"|"fp16"|"fp32"`` for a device.

    ``Auto``: bf16 on cc >= 8.0, fp16 (with a loss scaler) on 7.x, fp32 below
    (``gpu-facts.md``: bf16 needs cc >= 8.0; do not trust ``is_bf16_supported()`` on a T4).
    """
    if policy != "Auto":
        return policy.lower()
    major = int(compute_capability.split(".")[0])
    return "bf16" if major >= 8 else "fp16" if major == 7 else "fp32"


def device_rejection(job: JobSpec, dev: Device) -> tuple[str, str] | None:
    """Why ``job`` cannot use ``dev`` (reason, message), or None. Ignores free counts and images."""
    g, t = job.gpus, job.training
    denied = type_rejection(job, dev.product, dev.mig_profile)
    if denied:
        return model.DENIED_BY_SPEC, denied
    if dev.memory_mib < g.min_memory_mib:
        return (model.INSUFFICIENT_MEMORY, f"{dev.gpu_type} has {dev.memory_mib} MiB < "
                f"spec.gpus.minMemoryMiB {g.min_memory_mib}")
    if memory_cap(job, dev.memory_mib) < 1:
        return (model.INSUFFICIENT_MEMORY, f"{dev.gpu_type} has {dev.memory_mib} MiB, less than "
                f"memoryReserveMiB {t.memory_reserve_mib} + one sample of {t.memory_per_sample_mib} MiB")
    if t.precision == "BF16" and int(dev.compute_capability.split(".")[0]) < 8:
        return (model.PRECISION_UNSUPPORTED, f"{dev.gpu_type} (cc {dev.compute_capability}) has no "
                "bf16; spec.training.precision BF16 needs cc >= 8.0 (use Auto)")
    return None


def type_rejection(job: JobSpec, product: str, mig_profile: str) -> str:
    """Allow/deny-list verdict for a GPU type: ``""`` when allowed, else the reason sentence."""
    g = job.gpus
    full = model.gpu_type_name(product, mig_profile)
    if g.allowed_products and product not in g.allowed_products and full not in g.allowed_products:
        return f"{product} is not in spec.gpus.allowedProducts" + _short_name_hint(
            g.allowed_products, product)
    if product in g.denied_products or full in g.denied_products:
        return f"{product} is in spec.gpus.deniedProducts"
    if mig_profile:
        if not g.allow_mig:
            return f"{full} is a MIG device and spec.gpus.allowMig is false"
        if g.allowed_mig_profiles and mig_profile not in g.allowed_mig_profiles:
            return f"MIG profile {mig_profile} is not in spec.gpus.allowedMigProfiles"
        if mig_profile in g.denied_mig_profiles:
            return f"MIG profile {mig_profile} is in spec.gpus.deniedMigProfiles"
    return ""


def memory_cap(job: JobSpec, memory_mib: int) -> int:
    """Largest local batch that fits: ``(memory - reserve) // per_sample``; the global batch when
    ``memoryPerSampleMiB`` is 0 (no cap)."""
    t = job.training
    if t.memory_per_sample_mib <= 0:
        return t.global_batch_size
    return max(0, (memory_mib - t.memory_reserve_mib) // t.memory_per_sample_mib)


def _short_name_hint(allowed: tuple[str, ...] | list[str], product: str) -> str:
    """``"; A100 matches no product: the list takes full names as GPU Feature Discovery labels
    them: did you mean NVIDIA-A100-SXM4-40GB?"`` when an entry is a part of ``product``'s name
    (case aside), else ``""``."""
    lowered = product.lower()
    short = [a for a in allowed if a and a.lower() in lowered and a != product]
    if not short:
        return ""
    return (f"; {', '.join(short)} {'matches' if len(short) == 1 else 'match'} no product: the list "
            "takes full product names as GPU Feature Discovery labels them (nvidia.com/gpu.product):"
            f" did you mean {product}?")
