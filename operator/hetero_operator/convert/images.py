"""A container image as an entry of ``spec.images``, when its tag says its CUDA version (pure).

``spec.images`` needs each image's CUDA version and the compute capabilities it has kernels for; a
PyTorchJob names only the image.  Tags of PyTorch's own images and most derived ones carry the CUDA
version (``pytorch/pytorch:2.5.1-cuda12.4-cudnn9-runtime``, ``...-cu121``), and PyTorch's release
builds for a CUDA version cover a known set of compute capabilities (:data:`PYTORCH_ARCHS`).
"""

from __future__ import annotations

import re
from typing import Any

_CUDA_TAG = re.compile(r"(?:cuda|cu)[-_]?(\d{2})\.?(\d)(?![\d])")
_TORCH_TAG = re.compile(r"^(\d\.\d{1,2}\.\d{1,2})")
PYTORCH_ARCHS: tuple[tuple[tuple[int, int], tuple[str, ...]], ...] = (
    ((11, 0), ("3.7", "5.0", "6.0", "7.0", "7.5", "8.0", "8.6")),
    ((11, 8), ("3.7", "5.0", "6.0", "7.0", "7.5", "8.0", "8.6", "9.0")),
    ((12, 0), ("5.0", "6.0", "7.0", "7.5", "8.0", "8.6", "9.0")),
    ((12, 8), ("7.5", "8.0", "8.6", "9.0", "10.0", "12.0")),
)
"""(lowest CUDA version, compute capabilities of PyTorch's release builds for it), ascending: what
an image tagged with a CUDA version (``pytorch/pytorch:2.5.1-cuda12.4-cudnn9-runtime``, ``-cu121``)
is assumed to have kernels for."""


def image_entry(image: str) -> dict[str, Any] | None:
    """``{image, cudaVersion, computeCapabilities[, torchVersion]}`` from the tag, None when the
    tag names no CUDA version."""
    last = image.rsplit("/", 1)[-1]
    tag = last.rsplit(":", 1)[1] if ":" in last else ""
    found = _CUDA_TAG.search(tag)
    if not found:
        return None
    cuda = (int(found.group(1)), int(found.group(2)))
    archs = next((a for low, a in reversed(PYTORCH_ARCHS) if cuda >= low), PYTORCH_ARCHS[0][1])
    entry: dict[str, Any] = {"image": image, "cudaVersion": f"{cuda[0]}.{cuda[1]}",
                             "computeCapabilities": list(archs)}
    torch = _TORCH_TAG.match(tag)
    if torch:
        entry["torchVersion"] = torch.group(1)
    return entry
