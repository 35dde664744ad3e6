"""Built-in speed table: product matching, sources, MIG scaling and overrides."""

from __future__ import annotations

import pytest

from hetero_operator.cluster.gputable import (GPU_MODELS, base_speed, effective_speed, lookup_model,
                                              memory_from_name, normalise_product)


@pytest.mark.parametrize(("product", "model", "cc"), [
    ("NVIDIA-A100-SXM4-40GB", "A100", "8.0"), ("A100-PCIE-40GB", "A100", "8.0"),
    ("NVIDIA-A100-80GB-PCIe", "A100", "8.0"), ("NVIDIA-H100-80GB-HBM3", "H100 SXM", "9.0"),
    ("NVIDIA-H100-PCIe", "H100 PCIe", "9.0"), ("NVIDIA-H100-NVL", "H100 NVL", "9.0"),
    ("NVIDIA-H200", "H200", "9.0"), ("NVIDIA-GH200-480GB", "GH200", "9.0"),
    ("Tesla-V100-SXM2-16GB", "V100 SXM2", "7.0"), ("Tesla-V100-PCIE-32GB", "V100 PCIe", "7.0"),
    ("Tesla-V100S-PCIE-32GB", "V100S", "7.0"), ("Tesla-T4", "T4", "7.5"), ("NVIDIA-L4", "L4", "8.9"),
    ("NVIDIA-L40S", "L40S", "8.9"), ("NVIDIA-L40", "L40", "8.9"), ("NVIDIA-A10G", "A10G", "8.6"),
    ("NVIDIA-A10", "A10", "8.6"), ("NVIDIA-A30", "A30", "8.0"), ("NVIDIA-A40", "A40", "8.6"),
    ("NVIDIA-GeForce-RTX-4090", "RTX 4090", "8.9"), ("NVIDIA-GeForce-RTX-3080", "RTX 3080", "8.6"),
    ("NVIDIA-RTX-A6000", "RTX A6000", "8.6"), ("NVIDIA-B200", "B200", "10.0"), ("Tesla-P100-PCIE-16GB", "P100", "6.0"),
])
def test_products_match_the_right_row(product: str, model: str, cc: str) -> None:
    row = lookup_model(product)
    assert row is not None and (row.name, row.compute_capability) == (model, cc)


def test_reference_and_relative_figures() -> None:
    assert base_speed("NVIDIA-A100-SXM4-80GB", "ampere") == (1.0, True)
    assert base_speed("NVIDIA-H100-80GB-HBM3", "hopper")[0] == pytest.approx(989 / 312)
    assert base_speed("Tesla-T4", "turing")[0] == pytest.approx(65 / 312)
    assert base_speed("NVIDIA-Unknown-9000", "hopper") == (3.0, False)
    assert all(m.source and m.tflops > 0 for m in GPU_MODELS)


def test_names_and_memory_parsing() -> None:
    assert normalise_product("NVIDIA-GeForce-RTX-4090") == "RTX-4090"
    assert (memory_from_name("NVIDIA-A100-SXM4-80GB"), memory_from_name("Tesla-T4")) == (81920, 0)


def test_overrides_full_type_then_profile_then_product_scaled() -> None:
    kw = dict(product="P", mig_profile="3g.40gb", table_speed=0.3, compute_slices=3)
    assert effective_speed(**kw, overrides={}) == 0.3
    assert effective_speed(**kw, overrides={"P": 140}) == pytest.approx(0.6)
    assert effective_speed(**kw, overrides={"P": 140, "3g.40gb": 50}) == 0.5
    assert effective_speed(**kw, overrides={"P": 140, "3g.40gb": 50, "P-MIG-3g.40gb": 20}) == 0.2
    assert effective_speed(product="P", mig_profile="", table_speed=0.3, compute_slices=7,
                           overrides={"P": 250, "3g.40gb": 1}) == 2.5
