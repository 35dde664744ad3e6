"""Which CUDA runtime a Linux driver supports, and the highest CUDA a node can run.

Source: NVIDIA CUDA Toolkit release notes, table 3 ("CUDA Toolkit and Corresponding Driver
Versions", minimum Linux x86_64 driver for each CUDA release; as collected in
``shared/docs/gpu-facts.md``).  The rule is conservative: a container whose runtime is newer than
the driver fails with "CUDA driver version is insufficient for CUDA runtime version"
(NVIDIA/gpu-operator issues 176, 343, 1428), so CUDA minor-version compatibility is only assumed
for an image variant that declares it (``cudaMinorVersionCompatible``, see
:func:`minor_version_compatible`).
"""

from __future__ import annotations

MIN_DRIVER_FOR_CUDA: tuple[tuple[tuple[int, int], tuple[int, int]], ...] = (
    ((11, 0), (450, 36)),
    ((11, 1), (455, 23)),
    ((11, 2), (460, 27)),
    ((11, 3), (465, 19)),
    ((11, 4), (470, 42)),
    ((11, 5), (495, 29)),
    ((11, 6), (510, 39)),
    ((11, 7), (515, 43)),
    ((11, 8), (520, 61)),
    ((12, 0), (525, 60)),
    ((12, 1), (530, 30)),
    ((12, 2), (535, 54)),
    ((12, 3), (545, 23)),
    ((12, 4), (550, 54)),
    ((12, 5), (555, 42)),
    ((12, 6), (560, 28)),
    ((12, 8), (570, 26)),
    ((12, 9), (575, 51)),
    ((13, 0), (580, 65)),
)
"""(CUDA version, minimum Linux driver (major, minor)), ascending.  Drivers newer than the last
row are capped at its CUDA version (the table knows nothing newer)."""


def cuda_for_driver(major: int, minor: int | None = None) -> tuple[int, int] | None:
    """Highest CUDA runtime a driver supports.

    Args:
        major: driver branch, e.g. ``550``.
        minor: driver minor, e.g. ``107``; ``None`` when only the branch is labelled, in which
            case a branch is assumed to meet its own row (the first public release of each branch
            listed here is at or above the table's minimum).

    Returns:
        ``(major, minor)`` CUDA version, or ``None`` for drivers older than CUDA 11.0's.
    """
    best = None
    for cuda, (need_major, need_minor) in MIN_DRIVER_FOR_CUDA:
        if major > need_major or (major == need_major and (minor is None or minor >= need_minor)):
            best = cuda
    return best


def min_driver_for(cuda: tuple[int, int]) -> str:
    """Minimum driver for a CUDA version as ``"550.54"``; the next listed release's when unlisted."""
    for version, (major, minor) in MIN_DRIVER_FOR_CUDA:
        if version >= cuda:
            return f"{major}.{minor:02d}"
    return "newer than the table"


def format_cuda(cuda: tuple[int, int] | None) -> str:
    """``(12, 4)`` -> ``"12.4"``; ``None`` -> ``"unknown"``."""
    return "unknown" if cuda is None else f"{cuda[0]}.{cuda[1]}"


MINOR_VERSION_COMPAT_MIN_DRIVER: dict[int, tuple[int, int, int]] = {
    11: (450, 80, 2),
    12: (525, 60, 13),
    13: (580, 0, 0),
}
"""CUDA major family -> minimum Linux driver ``(major, minor, revision)`` for CUDA minor-version
compatibility.

Source: NVIDIA "CUDA Compatibility" guide (docs.nvidia.com/deploy/cuda-compatibility/), section
"Minor Version Compatibility", table "CUDA Toolkit / Minimum Required Driver Version for CUDA Minor
Version Compatibility": 11.x >= 450.80.02, 12.x >= 525.60.13, 13.x >= 580.  An application built
with any toolkit of a major family runs on a driver of that family's minimum, with two limits the
guide names: the binary must carry SASS for the GPU (a driver cannot JIT PTX newer than itself)
and features that need a newer driver are unavailable (``cudaErrorCallRequiresNewerDriver``)."""


def parse_driver(driver_version: str) -> tuple[int, int, int] | None:
    """``"550.107.02"`` -> ``(550, 107, 2)``; ``"550"`` -> ``(550, 0, 0)``; None when empty or
    malformed."""
    parts = driver_version.strip().split(".")
    if not parts[0].isdigit():
        return None
    nums = [int(p) if p.isdigit() else 0 for p in parts[1:3]]
    return (int(parts[0]), *nums, *[0] * (2 - len(nums)))  # type: ignore[return-value]


def minor_version_compatible(cuda: tuple[int, int], *, driver_version: str,
                             max_cuda: tuple[int, int] | None) -> bool:
    """Whether a node may run a CUDA ``cuda`` runtime through minor-version compatibility.

    Args:
        cuda: the image's CUDA version, ``(12, 6)``.
        driver_version: the node's driver label, ``"550.107.02"``; ``""`` when unlabelled.
        max_cuda: highest CUDA the node runs natively; used when the driver is unlabelled (a
            node that runs ``M.0`` natively has at least the ``M.0`` driver, which for 12.x and
            13.x equals the family's compatibility minimum and for 11.x is 450.36 < 450.80: an
            11.x variant then needs the driver label).

    Returns:
        True when the driver meets :data:`MINOR_VERSION_COMPAT_MIN_DRIVER` for ``cuda``'s major.
    """
    need = MINOR_VERSION_COMPAT_MIN_DRIVER.get(cuda[0])
    if need is None:
        return False
    driver = parse_driver(driver_version)
    if driver is not None:
        return driver >= need
    return cuda[0] >= 12 and max_cuda is not None and max_cuda >= (cuda[0], 0)
