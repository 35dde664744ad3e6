"""Choose the worker image variant for a node: CUDA that fits the driver, kernels for the GPU.

Policy: among the job's variants (``spec.images``) whose CUDA version is <= the node's highest
CUDA (``min(runtime label, driver table)``, see :mod:`hetero_operator.cluster.cudatable`) and whose
``computeCapabilities`` include the GPU's compute capability exactly, take the newest CUDA; ties go
to the earlier catalog entry.  A wheel without kernels for the GPU's cc fails with "no kernel image
is available for execution on the device" (a V100 needs ``7.0``), and a runtime newer than the
driver fails with "CUDA driver version is insufficient" (``shared/docs/gpu-facts.md``).  When the
node's CUDA is unknown (no driver/runtime labels) only the compute capability is checked.

Before any of that, a variant must be built for the node's platform (``spec.images[].platforms``,
default linux/amd64, against ``kubernetes.io/os``/``kubernetes.io/arch``;
:mod:`hetero_operator.api.platforms`): an amd64-only image on a Grace Hopper (arm64) node fails
with ``exec format error`` or no matching manifest (shared case 53).  A node without the arch label
takes any variant.

CUDA minor-version compatibility is opt-in per variant (``cudaMinorVersionCompatible``): when no
variant fits natively, a declaring variant whose CUDA major family the driver supports
(:func:`~hetero_operator.cluster.cudatable.minor_version_compatible`; NVIDIA's "CUDA Compatibility" guide)
is chosen, the oldest such CUDA first (the smallest step beyond the driver), and the choice carries
a warning for the plan.
"""

from __future__ import annotations

from dataclasses import dataclass

from hetero_operator.api.platforms import ARCH_LABEL, DEFAULT_PLATFORMS, OS_LABEL, runs_on
from hetero_operator.api.spec import ImageVariant
from hetero_operator.cluster.cudatable import (MINOR_VERSION_COMPAT_MIN_DRIVER, format_cuda,
                                               min_driver_for, minor_version_compatible,
                                               parse_driver)


@dataclass(frozen=True, kw_only=True, slots=True)
class ImageChoice:
    """Result of :func:`choose_image`.

    Attributes:
        image: chosen image reference, ``""`` when none fits (or the catalog is empty).
        message: for no fit, one sentence naming the driver and what would fit.
        variant: the chosen catalog entry, None when nothing fits.
        minor_compat_warning: non-empty when the variant runs only through CUDA minor-version
            compatibility: one sentence for the plan's warnings.
    """

    image: str
    message: str = ""
    variant: ImageVariant | None = None
    minor_compat_warning: str = ""

    @property
    def ok(self) -> bool:
        """A variant was found."""
        return bool(self.image)


def choose_image(catalog: tuple[ImageVariant, ...], *, compute_capability: str,
                 max_cuda: tuple[int, int] | None, driver_version: str = "",
                 platform: str | None = None) -> ImageChoice:
    """Pick the newest fitting variant.

    Args:
        catalog: the job's variants, in manifest order.
        compute_capability: the GPU's, ``"7.0"``.
        max_cuda: highest CUDA the node runs, ``(12, 4)``; None when unknown.
        driver_version: for the message, e.g. ``"470.129.06"``.
        platform: the node's ``os/arch`` (``"linux/arm64"``,
            :func:`hetero_operator.api.platforms.node_platform`); None when unknown (any variant).

    Returns:
        :class:`ImageChoice`; ``image == ""`` with a message when nothing fits.
    """
    built = tuple(v for v in catalog if runs_on(v.platforms, platform))
    if not built:
        return ImageChoice(image="", message=_no_platform_message(catalog, platform or ""))
    catalog = built
    with_cc = [v for v in catalog if compute_capability in v.compute_capabilities]
    fitting = [v for v in with_cc if max_cuda is None or v.cuda_version <= max_cuda]
    if fitting:
        best = max(fitting, key=lambda v: v.cuda_version)  # max keeps the first of equal keys
        return ImageChoice(image=best.image, variant=best)
    compat = [v for v in with_cc if v.cuda_minor_version_compatible and minor_version_compatible(
        v.cuda_version, driver_version=driver_version, max_cuda=max_cuda)]
    if compat:
        best = min(compat, key=lambda v: v.cuda_version)  # min keeps the first of equal keys
        driver = f"driver {driver_version}" if driver_version else "the node's driver"
        return ImageChoice(image=best.image, variant=best, minor_compat_warning=(
            f"{best.image} (CUDA {format_cuda(best.cuda_version)}) runs on {driver} (CUDA <= "
            f"{format_cuda(max_cuda)}) through CUDA minor-version compatibility, as the variant "
            f"allows: fine for kernels built for cc {compute_capability} (no newer-PTX JIT, no "
            f"newer-driver features); driver >= {min_driver_for(best.cuda_version)} runs it "
            "natively"))
    return ImageChoice(image="", message=_no_fit_message(catalog, compute_capability, max_cuda,
                                                         driver_version))


def _no_platform_message(catalog: tuple[ImageVariant, ...], platform: str) -> str:
    """No variant is built for the node's platform: name it, the labels, what the catalog has."""
    have = sorted({p for v in catalog for p in v.platforms})
    defaulted = any(v.platforms == DEFAULT_PLATFORMS for v in catalog)
    return (f"no image variant is built for {platform}, this node's platform (labels {OS_LABEL}, "
            f"{ARCH_LABEL}); spec.images has {', '.join(have)}"
            f"{' (an entry without platforms is linux/amd64)' if defaulted else ''}: add a variant "
            f"built for {platform} listing it in spec.images[].platforms (a multi-arch image lists "
            "every platform it has), or keep the job off such nodes (a nodeSelector on "
            f"{ARCH_LABEL} in spec.worker.template)")


def _needed_driver(variant: ImageVariant) -> tuple[int, int, int]:
    """The oldest driver that runs ``variant``: its family's minor-version-compatibility minimum
    when it opts in, else the driver of its CUDA version (``cuda_table``)."""
    family_min = MINOR_VERSION_COMPAT_MIN_DRIVER.get(variant.cuda_version[0])
    if variant.cuda_minor_version_compatible and family_min is not None:
        return family_min
    native = parse_driver(min_driver_for(variant.cuda_version))
    return native if native is not None else (10**6, 0, 0)


def _format_driver(driver: tuple[int, int, int]) -> str:
    """``(525, 60, 13)`` -> ``"525.60.13"``; ``(560, 28, 0)`` -> ``"560.28"``."""
    return f"{driver[0]}.{driver[1]:02d}" + (f".{driver[2]:02d}" if driver[2] else "")


def _no_fit_message(catalog: tuple[ImageVariant, ...], cc: str, max_cuda: tuple[int, int] | None,
                    driver_version: str) -> str:
    driver = f"driver {driver_version}" if driver_version else "the node's driver"
    limit = f"supports CUDA <= {format_cuda(max_cuda)}" if max_cuda else "has an unknown CUDA version"
    with_cc = [v for v in catalog if cc in v.compute_capabilities]
    if with_cc:
        have = ", ".join(f"{format_cuda(v.cuda_version)}" for v in with_cc)
        return (f"{driver} {limit}; variants with cc {cc} kernels need CUDA {have} "
                f"(driver >= {_format_driver(min(_needed_driver(v) for v in with_cc))}); add a variant with CUDA "
                f"<= {format_cuda(max_cuda)} and cc {cc}, or upgrade the driver")
    return (f"no variant has kernels for cc {cc} ({driver} {limit}); add a variant listing "
            f"\"{cc}\" in computeCapabilities with CUDA <= {format_cuda(max_cuda)}")
