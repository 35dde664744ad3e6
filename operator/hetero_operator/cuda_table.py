"""Which CUDA runtime a Linux driver supports, and the highest CUDA a node can run.

Source: NVIDIA CUDA Toolkit release notes, table 3 ("CUDA Toolkit and Corresponding Driver
Versions", minimum Linux x86_64 driver for each CUDA release; as collected in
``shared/docs/gpu-facts.md``).  The rule is conservative: CUDA minor-version compatibility (an 11.x
build on any 450+ driver with restrictions) is not assumed, because a container whose runtime is
newer than the driver fails with "CUDA driver version is insufficient for CUDA runtime version"
(NVIDIA/gpu-operator issues 176, 343, 1428).
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
