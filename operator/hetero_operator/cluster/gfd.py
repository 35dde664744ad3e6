"""Read NVIDIA GPU Feature Discovery (GFD) node labels, current and deprecated spellings.

Source: NVIDIA/k8s-device-plugin, ``docs/gpu-feature-discovery/README.md`` and ``internal/lm/``
(label names and meaning), the GPU Operator MIG and GPU-sharing docs (``mig.config.state``,
``-SHARED`` products, ``gpu.sharing-strategy``), as collected in ``shared/docs/gpu-facts.md``.
Readers raise :class:`LabelError` for a value that is present but malformed; the inventory turns it
into a ``MalformedLabels`` exclusion, never an exception out of ``build_inventory``.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

P = "nvidia.com/"
PRODUCT = P + "gpu.product"
COUNT = P + "gpu.count"
MEMORY = P + "gpu.memory"
FAMILY = P + "gpu.family"
CC_MAJOR = P + "gpu.compute.major"
CC_MINOR = P + "gpu.compute.minor"
MULTIPROCESSORS = P + "gpu.multiprocessors"
REPLICAS = P + "gpu.replicas"
SHARING = P + "gpu.sharing-strategy"
MIG_STRATEGY = P + "mig.strategy"
MIG_CONFIG = P + "mig.config"
MIG_STATE = P + "mig.config.state"
GPU_PRESENT = P + "gpu.present"
DEPLOY_PREFIX = P + "gpu.deploy."
PAUSED_FOR_MIG_CHANGE = "paused-for-mig-change"
"""Value the GPU Operator's MIG manager writes into ``nvidia.com/gpu.deploy.<component>`` while it
has stopped that component (device plugin, GFD, DCGM) to change the MIG layout (GPU Operator,
``mig-manager`` ``reconfigure-mig.sh``): the node is mid reconfiguration."""
DRIVER_FULL = (P + "cuda.driver-version.full",)
DRIVER_MAJOR = (P + "cuda.driver-version.major", P + "cuda.driver.major")
DRIVER_MINOR = (P + "cuda.driver-version.minor", P + "cuda.driver.minor")
DRIVER_REV = (P + "cuda.driver-version.revision", P + "cuda.driver.rev")
RUNTIME_FULL = (P + "cuda.runtime-version.full",)
RUNTIME_MAJOR = (P + "cuda.runtime-version.major", P + "cuda.runtime.major")
RUNTIME_MINOR = (P + "cuda.runtime-version.minor", P + "cuda.runtime.minor")
GPU_RESOURCE = "nvidia.com/gpu"
MIG_RESOURCE_PREFIX = "nvidia.com/mig-"

_MIG_LABEL = re.compile(r"^nvidia\.com/mig-(?P<profile>[^/]+?)\.(?P<field>count|memory|multiprocessors)$")
_PROFILE = re.compile(r"^(?:(?P<ci>\d+)c\.)?(?P<gi>\d+)g\.(?P<mem>\d+)gb(?:[+.]me)?$")
_INT = re.compile(r"^\d+$")

FAMILY_ALIASES = {"ada": "ada-lovelace", "adalovelace": "ada-lovelace", "ada-lovelace": "ada-lovelace"}
FAMILY_CC: dict[str, str] = {
    "kepler": "3.7", "maxwell": "5.2", "pascal": "6.0", "volta": "7.0", "turing": "7.5",
    "ampere": "8.0", "ada-lovelace": "8.9", "hopper": "9.0", "blackwell": "10.0",
}
"""Representative compute capability per family: the last-resort source when neither the compute
labels nor the product table give one."""


class LabelError(ValueError):
    """A label is present but malformed.

    Attributes:
        label: the label key.
    """

    def __init__(self, label: str, message: str) -> None:
        super().__init__(f"{label}: {message}")
        self.label = label


@dataclass(frozen=True, kw_only=True, slots=True)
class ProductName:
    """A ``gpu.product`` value taken apart.

    Attributes:
        base: product without suffixes, e.g. ``"NVIDIA-A100-PCIE-40GB"``.
        mig_profile: ``"1g.5gb"`` for the single-strategy ``-MIG-1g.5gb`` suffix, else ``""``.
        shared: the ``-SHARED`` suffix (time-slicing or MPS) was present.
        mig_invalid: ``-MIG-INVALID``: GFD found an inconsistent MIG layout.
    """

    base: str
    mig_profile: str = ""
    shared: bool = False
    mig_invalid: bool = False


def split_product(product: str) -> ProductName:
    """Split ``NVIDIA-A100-PCIE-40GB-MIG-1g.5gb`` / ``NVIDIA-A10G-SHARED`` into their parts."""
    shared = product.endswith("-SHARED")
    if shared:
        product = product[: -len("-SHARED")]
    base, sep, profile = product.partition("-MIG-")
    if not sep:
        return ProductName(base=product, shared=shared)
    if profile.upper() == "INVALID":
        return ProductName(base=base, shared=shared, mig_invalid=True)
    return ProductName(base=base, mig_profile=profile, shared=shared)


def read_int(labels: Mapping[str, str], key: str) -> int | None:
    """Integer label value; None when absent.

    Raises:
        LabelError: present but not a non-negative integer.
    """
    raw = labels.get(key)
    if raw is None or raw == "":
        return None
    text = str(raw).strip()
    if not _INT.match(text):
        raise LabelError(key, f"must be a non-negative integer, got {raw!r}")
    return int(text)


def _first_int(labels: Mapping[str, str], keys: tuple[str, ...]) -> int | None:
    for key in keys:
        value = read_int(labels, key)
        if value is not None:
            return value
    return None


def compute_capability(labels: Mapping[str, str]) -> str | None:
    """``"8.0"`` from ``gpu.compute.major/minor``; None when the major label is absent.

    Raises:
        LabelError: a malformed compute label.
    """
    major = read_int(labels, CC_MAJOR)
    if major is None:
        return None
    minor = read_int(labels, CC_MINOR)
    return f"{major}.{minor or 0}"


def architecture(cc: str) -> str:
    """GFD family for a compute capability.

    Source: GFD's mapping (NVIDIA/k8s-device-plugin PR 1060/1090, which fixed 8.9 -> ada-lovelace):
    3.x kepler, 5.x maxwell, 6.x pascal, 7.0-7.2 volta, 7.5 turing, 8.0-8.7 ampere,
    8.9 ada-lovelace, 9.x hopper, 10.x-12.x blackwell.
    """
    major, _, minor_s = cc.partition(".")
    ma, mi = int(major), int(minor_s or 0)
    if ma == 7:
        return "turing" if mi >= 5 else "volta"
    if ma == 8:
        return "ada-lovelace" if mi >= 9 else "ampere"
    return {3: "kepler", 5: "maxwell", 6: "pascal", 9: "hopper", 10: "blackwell",
            11: "blackwell", 12: "blackwell"}.get(ma, "unknown")


def family_label(labels: Mapping[str, str]) -> str:
    """The ``gpu.family`` label, normalised (``ada`` -> ``ada-lovelace``); ``""`` when absent."""
    raw = str(labels.get(FAMILY, "")).strip().lower()
    return FAMILY_ALIASES.get(raw, raw)


def driver_version(labels: Mapping[str, str]) -> tuple[str, int | None, int | None]:
    """Driver version as ``("550.107.02", 550, 107)``; ``("", None, None)`` when unlabelled.

    Reads ``cuda.driver-version.full/.major/.minor/.revision`` and the deprecated
    ``cuda.driver.major/.minor/.rev``.

    Raises:
        LabelError: a malformed driver label.
    """
    full = str(labels.get(DRIVER_FULL[0], "") or "").strip()
    if full:
        parts = full.split(".")
        if not all(_INT.match(p) for p in parts):
            raise LabelError(DRIVER_FULL[0], f"must look like 550.107.02, got {full!r}")
        return full, int(parts[0]), int(parts[1]) if len(parts) > 1 else None
    major = _first_int(labels, DRIVER_MAJOR)
    if major is None:
        return "", None, None
    minor = _first_int(labels, DRIVER_MINOR)
    rev = next((str(labels[k]) for k in DRIVER_REV if labels.get(k)), "")
    text = ".".join(p for p in (str(major), f"{minor:02d}" if minor is not None else "", rev) if p)
    return text, major, minor


def runtime_version(labels: Mapping[str, str]) -> tuple[int, int] | None:
    """Highest CUDA the node's labels claim, ``(12, 4)``; None when unlabelled.

    Raises:
        LabelError: a malformed runtime label.
    """
    full = str(labels.get(RUNTIME_FULL[0], "") or "").strip()
    if full:
        parts = full.split(".")
        if len(parts) > 3 or not all(_INT.match(p) for p in parts):
            raise LabelError(RUNTIME_FULL[0], f"must look like 12.4, got {full!r}")
        return int(parts[0]), int(parts[1]) if len(parts) > 1 else 0
    major = _first_int(labels, RUNTIME_MAJOR)
    if major is None:
        return None
    return major, _first_int(labels, RUNTIME_MINOR) or 0


def profile_slices(profile: str) -> int:
    """Compute slices (out of 7) of a MIG profile: ``"3g.40gb"`` -> 3, ``"1c.3g.20gb"`` -> 1.

    Raises:
        LabelError: not a MIG profile name.
    """
    match = _PROFILE.match(profile)
    if not match:
        raise LabelError(f"{MIG_RESOURCE_PREFIX}{profile}", "is not a MIG profile like 3g.40gb")
    return int(match.group("ci") or match.group("gi"))


@dataclass(frozen=True, slots=True)
class ProfileIdentity:
    """What a MIG profile *is*, without the memory string that drivers print differently.

    The device plugin names a resource from one driver query and GFD names its label family from
    another, so the same instance can be ``3g.20gb`` in allocatable and ``3g.21gb`` in the labels
    (issue 10).  Slices and the media-engine suffix do not vary.

    Attributes:
        compute_slices: compute-instance slices (``c`` part), equal to ``gi_slices`` without it.
        gi_slices: GPU-instance slices (``g`` part).
        media_extensions: the ``+me``/``.me`` suffix.
    """

    compute_slices: int
    gi_slices: int
    media_extensions: bool


def profile_identity(profile: str) -> ProfileIdentity:
    """``"1c.3g.20gb"`` -> ``ProfileIdentity(1, 3, False)``.

    Raises:
        LabelError: not a MIG profile name.
    """
    match = _PROFILE.match(profile)
    if not match:
        raise LabelError(f"{MIG_RESOURCE_PREFIX}{profile}", "is not a MIG profile like 3g.40gb")
    gi = int(match.group("gi"))
    return ProfileIdentity(int(match.group("ci") or gi), gi, profile.endswith("me"))


def join_mig_profiles(resources: Iterable[str], families: Iterable[str],
                      ) -> tuple[dict[str, str | None], tuple[str, ...]]:
    """Pair allocatable MIG profiles with GFD label families by profile identity.

    An exact name match wins; otherwise a family with the same :class:`ProfileIdentity` is taken,
    the one whose nominal memory is nearest (``1g.10gb`` and ``1g.20gb`` share slices on an
    A100-80GB, so memory still breaks ties).  Families whose name is not a MIG profile never match.

    Args:
        resources: profiles named by ``nvidia.com/mig-<profile>`` resources, e.g. ``["3g.20gb"]``.
        families: profiles named by ``nvidia.com/mig-<profile>.*`` labels, e.g. ``["3g.21gb"]``.

    Returns:
        ``({resource profile: family profile or None}, unmatched families)``, both in sorted order.

    Raises:
        LabelError: a resource profile is not a MIG profile name.
    """
    free = sorted(set(families))
    pairs: dict[str, str | None] = {}
    resources = sorted(set(resources))
    for profile in resources:
        profile_identity(profile)  # a malformed resource name is an error, not a silent skip
        if profile in free:
            pairs[profile] = profile
            free.remove(profile)
    for profile in resources:
        if profile in pairs:
            continue
        wanted = profile_identity(profile)
        candidates = [f for f in free if _identity_or_none(f) == wanted]
        if not candidates:
            pairs[profile] = None
            continue
        best = min(candidates, key=lambda f: (abs(profile_memory_mib(f) - profile_memory_mib(profile)), f))
        pairs[profile] = best
        free.remove(best)
    return dict(sorted(pairs.items())), tuple(free)


def _identity_or_none(profile: str) -> ProfileIdentity | None:
    try:
        return profile_identity(profile)
    except LabelError:
        return None


def paused_for_mig_change(labels: Mapping[str, str]) -> tuple[str, ...]:
    """``nvidia.com/gpu.deploy.*`` labels set to ``paused-for-mig-change``, sorted."""
    return tuple(sorted(k for k, v in labels.items()
                        if k.startswith(DEPLOY_PREFIX) and str(v).strip() == PAUSED_FOR_MIG_CHANGE))


def profile_memory_mib(profile: str) -> int:
    """Nominal memory from a profile name (``3g.40gb`` -> 40960); the labels are preferred."""
    match = _PROFILE.match(profile)
    return int(match.group("mem")) * 1024 if match else 0


def mig_profile_labels(labels: Mapping[str, str]) -> dict[str, dict[str, int]]:
    """Per-profile ``count``/``memory``/``multiprocessors`` labels of the mixed strategy.

    Returns:
        ``{"1g.5gb": {"count": 4, "memory": 4864, "multiprocessors": 14}, ...}``.

    Raises:
        LabelError: a malformed value.
    """
    out: dict[str, dict[str, int]] = {}
    for key in labels:
        match = _MIG_LABEL.match(key)
        if match:
            value = read_int(labels, key)
            if value is not None:
                out.setdefault(match.group("profile"), {})[match.group("field")] = value
    return out


def is_mig_resource(resource: str) -> bool:
    """True for ``nvidia.com/mig-<profile>`` resource names."""
    return resource.startswith(MIG_RESOURCE_PREFIX)
