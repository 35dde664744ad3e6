"""Built-in GPU table: relative training throughput, compute capability and memory per product.

Relative speed = the product's dense (no sparsity) tensor TFLOPS at its training precision divided
by the A100's 312 dense BF16 TFLOPS, so an A100 is 1.0.  For cc >= 7.0 that is the FP16/BF16
tensor-core figure with FP32 accumulate from the vendor datasheet or architecture whitepaper named in
each row; for cc < 7.0 (no tensor cores, trained in fp32) it is the FP32 figure.  These are
peak-rate ratios: real ratios depend on the model (memory bandwidth, communication), which is why a
job can override them (``spec.gpus.speedOverrides``, percent of an A100) and why workers report
measured throughput (issue 5) for later rebalancing.

A MIG device gets its parent's speed scaled by compute slices / 7 (``3g.40gb`` = 3/7): a MIG
instance gets that share of the GPU's SMs (NVIDIA MIG user guide, "Supported Profiles").
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

REFERENCE_TFLOPS = 312.0
"""A100 dense BF16 tensor TFLOPS (NVIDIA A100 Tensor Core GPU datasheet): the 1.0 of the scale."""

_NVIDIA_PREFIXES = ("NVIDIA-", "TESLA-", "GEFORCE-", "QUADRO-")


@dataclass(frozen=True, kw_only=True, slots=True)
class GpuModel:
    """One row of the built-in table.

    Attributes:
        name: model name, e.g. ``"A100"``.
        pattern: regex matched against the normalised product (upper case, ``NVIDIA-``,
            ``Tesla-``, ``GeForce-``, ``Quadro-`` prefixes removed).
        compute_capability: ``"8.0"``.
        memory_mib: typical memory when neither a label nor the product name says, MiB.
        tflops: dense tensor (cc >= 7.0) or FP32 (cc < 7.0) TFLOPS at the training precision.
        source: where ``tflops`` comes from.
    """

    name: str
    pattern: str
    compute_capability: str
    memory_mib: int
    tflops: float
    source: str

    @property
    def relative_speed(self) -> float:
        """``tflops / 312`` (A100 = 1.0)."""
        return self.tflops / REFERENCE_TFLOPS


def _m(name: str, pattern: str, cc: str, mem_mib: int, tflops: float, source: str) -> GpuModel:
    return GpuModel(name=name, pattern=pattern, compute_capability=cc, memory_mib=mem_mib,
                    tflops=tflops, source=source)


GPU_MODELS: tuple[GpuModel, ...] = (
    # Most specific patterns first.
    _m("GH200", r"^GH200", "9.0", 97871, 989, "NVIDIA GH200 datasheet: 989 TFLOPS BF16 dense"),
    _m("H200", r"^H200", "9.0", 143771, 989, "NVIDIA H200 datasheet (SXM): 989 TFLOPS BF16 dense"),
    _m("H100 NVL", r"^H100.*NVL", "9.0", 95830, 835, "NVIDIA H100 datasheet (NVL): 1,671 sparse / 2"),
    _m("H100 PCIe", r"^H100.*PCIE", "9.0", 81920, 756, "NVIDIA H100 datasheet (PCIe): 1,513 sparse / 2"),
    _m("H100 SXM", r"^H100", "9.0", 81559, 989, "NVIDIA H100 datasheet (SXM): 1,979 sparse / 2"),
    _m("B200", r"^B200", "10.0", 183359, 2250, "NVIDIA HGX B200 spec: 4.5 PFLOPS FP16/BF16 sparse / 2"),
    _m("A100", r"^A100", "8.0", 40960, 312, "NVIDIA A100 datasheet: 312 TFLOPS BF16 dense"),
    _m("A30", r"^A30(?![0-9])", "8.0", 24576, 165, "NVIDIA A30 datasheet: 165 TFLOPS BF16 dense"),
    _m("A40", r"^A40(?![0-9])", "8.6", 46068, 149.7, "NVIDIA A40 datasheet: 149.7 TFLOPS BF16 dense"),
    _m("A10G", r"^A10G", "8.6", 23028, 70,
       "estimate: AWS publishes no tensor figure for A10G; ~70 TFLOPS FP16 dense from published "
       "benchmarks (clock-limited A10); override with speedOverrides after measuring"),
    _m("A10", r"^A10(?![0-9G])", "8.6", 23028, 125, "NVIDIA A10 datasheet: 125 TFLOPS BF16 dense"),
    _m("L40S", r"^L40S", "8.9", 46068, 362, "NVIDIA L40S datasheet: 733 TFLOPS BF16 sparse / 2"),
    _m("L40", r"^L40(?![0-9S])", "8.9", 46068, 181, "NVIDIA L40 datasheet: 362 TFLOPS BF16 sparse / 2"),
    _m("L4", r"^L4(?![0-9])", "8.9", 23034, 121, "NVIDIA L4 datasheet: 242 TFLOPS BF16 sparse / 2"),
    _m("V100S", r"^V100S", "7.0", 32768, 130, "NVIDIA V100S datasheet: 130 TFLOPS tensor (FP16)"),
    _m("V100 PCIe", r"^V100.*PCIE", "7.0", 16384, 112, "NVIDIA V100 datasheet (PCIe): 112 TFLOPS tensor"),
    _m("V100 SXM2", r"^V100", "7.0", 16384, 125, "NVIDIA V100 datasheet (SXM2): 125 TFLOPS tensor"),
    _m("T4", r"^T4(?![0-9])", "7.5", 15360, 65, "NVIDIA T4 datasheet: 65 TFLOPS FP16 mixed precision"),
    _m("RTX A6000", r"^RTX-A6000", "8.6", 49140, 154.8,
       "NVIDIA Ampere GA102 whitepaper (RTX A6000): 309.7 TFLOPS FP16 sparse / 2"),
    _m("RTX 5090", r"^RTX-5090", "12.0", 32607, 209.5,
       "NVIDIA RTX Blackwell whitepaper (5090): 209.5 TFLOPS FP16 w/ FP32 accumulate dense"),
    _m("RTX 4090", r"^RTX-4090", "8.9", 24564, 165.2,
       "NVIDIA Ada whitepaper (4090): 165.2 TFLOPS FP16 w/ FP32 accumulate dense"),
    _m("RTX 3090", r"^RTX-3090", "8.6", 24576, 71,
       "NVIDIA Ampere GA102 whitepaper (3090): 71 TFLOPS FP16 w/ FP32 accumulate dense"),
    _m("RTX 3080", r"^RTX-3080", "8.6", 10240, 59.5,
       "NVIDIA Ampere GA102 whitepaper (3080): 59.5 TFLOPS FP16 w/ FP32 accumulate dense"),
    _m("P100", r"^P100", "6.0", 16384, 9.3, "NVIDIA P100 datasheet (PCIe): 9.3 TFLOPS FP32"),
)
"""The built-in table, most specific pattern first."""

PRODUCT_LABELS: dict[str, str] = {
    "GH200": "NVIDIA-GH200-480GB", "H200": "NVIDIA-H200", "H100 NVL": "NVIDIA-H100-NVL",
    "H100 PCIe": "NVIDIA-H100-PCIe", "H100 SXM": "NVIDIA-H100-80GB-HBM3", "B200": "NVIDIA-B200",
    "A100": "NVIDIA-A100-SXM4-40GB", "A30": "NVIDIA-A30", "A40": "NVIDIA-A40", "A10G": "NVIDIA-A10G",
    "A10": "NVIDIA-A10", "L40S": "NVIDIA-L40S", "L40": "NVIDIA-L40", "L4": "NVIDIA-L4",
    "V100S": "Tesla-V100S-PCIE-32GB", "V100 PCIe": "Tesla-V100-PCIE-16GB",
    "V100 SXM2": "Tesla-V100-SXM2-16GB", "T4": "Tesla-T4", "RTX A6000": "NVIDIA-RTX-A6000",
    "RTX 5090": "NVIDIA-GeForce-RTX-5090", "RTX 4090": "NVIDIA-GeForce-RTX-4090",
    "RTX 3090": "NVIDIA-GeForce-RTX-3090", "RTX 3080": "NVIDIA-GeForce-RTX-3080",
    "P100": "Tesla-P100-PCIE-16GB",
}
"""Per row of :data:`GPU_MODELS`, the ``nvidia.com/gpu.product`` GPU Feature Discovery labels that
GPU with (nvidia-smi's name, spaces as dashes), at the row's memory: how the planner names a GPU
the cluster may not have ("needs at least an NVIDIA-H100-80GB-HBM3 ...")."""

_COMPILED = tuple((re.compile(m.pattern), m) for m in GPU_MODELS)

ARCH_FALLBACK_SPEED: dict[str, float] = {
    "kepler": 0.01, "maxwell": 0.02, "pascal": 0.03, "volta": 0.4, "turing": 0.2,
    "ampere": 0.4, "ada-lovelace": 0.5, "hopper": 3.0, "blackwell": 5.0,
}
"""Speed for a product missing from the table, by architecture (a conservative mid-range part of
that generation); an ``UnknownGpuSpeed`` warning says so."""

_CACHE: dict[str, GpuModel | None] = {}


def normalise_product(product: str) -> str:
    """Upper-case and drop ``NVIDIA-``/``Tesla-``/``GeForce-``/``Quadro-`` prefixes."""
    p = product.upper()
    changed = True
    while changed:
        changed = False
        for prefix in _NVIDIA_PREFIXES:
            if p.startswith(prefix):
                p, changed = p[len(prefix):], True
    return p


def lookup_model(product: str) -> GpuModel | None:
    """The table row for a base GFD product (no ``-MIG-``/``-SHARED`` suffix), or None."""
    if product not in _CACHE:
        norm = normalise_product(product)
        _CACHE[product] = next((m for rx, m in _COMPILED if rx.search(norm)), None)
    return _CACHE[product]


def memory_from_name(product: str) -> int:
    """Memory from a product name such as ``A100-SXM4-80GB`` (80 * 1024 MiB); 0 when absent."""
    match = re.search(r"(\d+)GB", product.upper())
    return int(match.group(1)) * 1024 if match else 0


def base_speed(product: str, architecture: str) -> tuple[float, bool]:
    """Relative speed of a whole GPU.

    Returns:
        ``(speed, known)``; ``known`` is False when the architecture fallback was used.
    """
    model = lookup_model(product)
    if model is not None:
        return model.relative_speed, True
    return ARCH_FALLBACK_SPEED.get(architecture, 0.1), False


def mig_speed(parent_speed: float, compute_slices: int) -> float:
    """Speed of a MIG device: ``parent_speed * compute_slices / 7``."""
    return parent_speed * compute_slices / 7


def effective_speed(*, product: str, mig_profile: str, table_speed: float, compute_slices: int,
                    overrides: Mapping[str, int]) -> float:
    """Apply ``spec.gpus.speedOverrides`` (percent of an A100) to a device's table speed.

    Lookup order: the full GFD type (``NVIDIA-A100-SXM4-40GB-MIG-1g.5gb``), then the MIG profile
    (``1g.5gb``, absolute), then the base product (scaled by compute slices / 7 for MIG devices),
    else the table speed.

    Returns:
        Relative speed, A100 = 1.0.
    """
    if not overrides:
        return table_speed
    if mig_profile:
        full = f"{product}-MIG-{mig_profile}"
        if full in overrides:
            return overrides[full] / 100
        if mig_profile in overrides:
            return overrides[mig_profile] / 100
        if product in overrides:
            return mig_speed(overrides[product] / 100, compute_slices)
        return table_speed
    if product in overrides:
        return overrides[product] / 100
    return table_speed
