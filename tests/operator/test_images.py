"""Image choice: CUDA <= what the driver supports, kernels for the GPU's compute capability."""

from __future__ import annotations

import pytest
from builders import CATALOG_118_124_128, make_job, make_node
from hypothesis import given, settings
from hypothesis import strategies as st

from hetero_operator.api import types as model
from hetero_operator.api.spec import ImageVariant
from hetero_operator.cluster.cudatable import cuda_for_driver, min_driver_for
from hetero_operator.cluster.inventory import build_inventory
from hetero_operator.planning.images import choose_image
from hetero_operator.planning.plan import plan_job

CATALOG = make_job(images=CATALOG_118_124_128).images


@pytest.mark.parametrize(("major", "minor", "cuda"), [
    (450, 36, (11, 0)), (450, 35, None), (470, None, (11, 4)), (470, 129, (11, 4)),
    (520, 56, (11, 7)), (520, 61, (11, 8)), (535, 183, (12, 2)), (550, 54, (12, 4)),
    (550, 40, (12, 3)), (570, 124, (12, 8)), (580, 65, (13, 0)), (590, 10, (13, 0)), (390, 1, None),
])
def test_driver_table(major: int, minor: int | None, cuda: tuple | None) -> None:
    assert cuda_for_driver(major, minor) == cuda


def test_min_driver_for() -> None:
    assert (min_driver_for((12, 4)), min_driver_for((12, 7)), min_driver_for((11, 0))) == (
        "550.54", "570.26", "450.36")


@pytest.mark.parametrize(("driver", "runtime", "cc", "image"), [
    ("470.239.06", "11.4", "8.0", ""),
    ("550.127.05", "12.4", "8.0", "reg/train:cu124"),
    ("580.65.06", "13.0", "8.0", "reg/train:cu128"),
    ("550.127.05", "12.4", "7.0", "reg/train:cu124"),
    ("580.65.06", "13.0", "7.0", "reg/train:cu124"),
    ("580.65.06", "13.0", "7.5", "reg/train:cu128"),
    ("535.54.03", "12.2", "8.9", "reg/train:cu118"),
    ("580.65.06", "12.6", "9.0", "reg/train:cu124"),
    ("580.65.06", "13.0", "12.0", "reg/train:cu128"),
], ids=["470: nothing up to 11.4", "550 A100: cu124", "580 A100: cu128",
        "550 V100: cu124", "580 V100: cu124 (cu128 has no sm_70)", "580 T4: cu128",
        "535 L4: cu118", "runtime label below the driver wins", "Blackwell only in cu128"])
def test_driver_470_550_580_against_cu118_cu124_cu128(driver: str, runtime: str, cc: str,
                                                      image: str) -> None:
    inv = build_inventory([make_node(driver=driver, runtime=runtime, cc=cc)])
    node = inv.nodes[0]
    choice = choose_image(CATALOG, compute_capability=cc, max_cuda=node.max_cuda,
                          driver_version=node.driver_version)
    assert choice.image == image


def test_no_fit_message_names_driver_and_what_would_fit() -> None:
    choice = choose_image(CATALOG, compute_capability="8.0", max_cuda=(11, 4), driver_version="470.239.06")
    assert not choice.ok
    assert choice.message == (
        "driver 470.239.06 supports CUDA <= 11.4; variants with cc 8.0 kernels need CUDA 11.8, 12.4, "
        "12.8 (driver >= 520.61); add a variant with CUDA <= 11.4 and cc 8.0, or upgrade the driver")


def test_no_variant_with_the_cc_says_so() -> None:
    choice = choose_image(CATALOG, compute_capability="5.2", max_cuda=(12, 4), driver_version="550.1")
    assert choice.message.startswith("no variant has kernels for cc 5.2 (driver 550.1 supports CUDA <= 12.4)")


def test_unknown_cuda_checks_only_the_compute_capability() -> None:
    assert choose_image(CATALOG, compute_capability="7.0", max_cuda=None).image == "reg/train:cu124"


def test_equal_cuda_versions_keep_catalog_order() -> None:
    twins = (ImageVariant(image="first", cuda_version=(12, 4), compute_capabilities=("8.0",)),
             ImageVariant(image="second", cuda_version=(12, 4), compute_capabilities=("8.0",)))
    assert choose_image(twins, compute_capability="8.0", max_cuda=(12, 4)).image == "first"


def test_planner_excludes_the_470_node_and_keeps_the_others() -> None:
    nodes = [make_node("old", driver="470.239.06", runtime="11.4"),
             make_node("new", driver="580.65.06", runtime="13.0")]
    plan = plan_job(make_job(ranks=2, min_ranks=1, images=CATALOG_118_124_128), build_inventory(nodes))
    assert isinstance(plan, model.Plan)
    assert [(r.node, r.image) for r in plan.ranks] == [("new", "reg/train:cu128")]
    assert [(e.node, e.reason) for e in plan.excluded] == [("old", "NoCompatibleImage")]


CCS = ["6.0", "7.0", "7.5", "8.0", "8.6", "8.9", "9.0"]
variants = st.builds(
    lambda i, cuda, ccs: ImageVariant(image=f"img{i}", cuda_version=cuda, compute_capabilities=tuple(ccs)),
    st.integers(0, 99), st.sampled_from([(11, 8), (12, 1), (12, 4), (12, 8), (13, 0)]),
    st.lists(st.sampled_from(CCS), min_size=1, max_size=5, unique=True))


@settings(max_examples=300, deadline=None)
@given(st.lists(variants, max_size=6, unique_by=lambda v: v.image), st.sampled_from([(11, 4), (12, 2), (12, 4), (12, 8), (13, 0), None]))
def test_v100_never_gets_a_variant_without_sm70(catalog: list[ImageVariant], max_cuda: tuple | None) -> None:
    choice = choose_image(tuple(catalog), compute_capability="7.0", max_cuda=max_cuda)
    fitting = [v for v in catalog if "7.0" in v.compute_capabilities
               and (max_cuda is None or v.cuda_version <= max_cuda)]
    if fitting:
        chosen = next(v for v in catalog if v.image == choice.image)
        assert "7.0" in chosen.compute_capabilities
        assert max_cuda is None or chosen.cuda_version <= max_cuda
        assert chosen.cuda_version == max(v.cuda_version for v in fitting)
    else:
        assert choice.image == "" and choice.message


# --- CUDA minor-version compatibility (opt-in per variant) and one PyTorch per job --------------

def _variant(image: str, cuda: str, ccs: list[str], **extra: object) -> dict:
    return {"image": image, "cudaVersion": cuda, "computeCapabilities": ccs, **extra}


COMPAT_CATALOG = [
    _variant("reg/w:cu126", "12.6", ["7.0", "7.5", "8.0"], torchVersion="2.13.0",
             cudaMinorVersionCompatible=True),
    _variant("reg/w:cu128", "12.8", ["7.5", "8.0", "9.0"], torchVersion="2.13.0"),
]


@pytest.mark.parametrize(("driver", "runtime", "cc", "image", "warned"), [
    ("550.107.02", "12.4", "8.0", "reg/w:cu126", True),    # 12.x family, below 12.6's 560.28
    ("525.60.13", "12.0", "7.0", "reg/w:cu126", True),     # exactly the 12.x minimum
    ("525.60.12", "12.0", "7.0", "", False),               # one below it
    ("520.61.05", "11.8", "8.0", "", False),               # 11.x driver: another major family
    ("570.124.06", "12.8", "8.0", "reg/w:cu128", False),   # native fit wins, no warning
    ("570.124.06", "12.8", "7.0", "reg/w:cu126", False),   # native (12.6 <= 12.8)
    ("550.107.02", "12.4", "9.0", "", False),              # cu128 did not opt in
    (None, "12.4", "8.0", "reg/w:cu126", True),            # unlabelled driver: runtime 12.x suffices
], ids=["550 minor-compat", "525.60 minimum", "below minimum", "11.x driver", "native cu128",
        "native cu126", "no opt-in", "runtime label only"])
def test_minor_version_compatibility_is_opt_in_per_variant(driver: str | None, runtime: str, cc: str,
                                                          image: str, warned: bool) -> None:
    catalog = make_job(images=COMPAT_CATALOG).images
    node = build_inventory([make_node(driver=driver, runtime=runtime, cc=cc)]).nodes[0]
    choice = choose_image(catalog, compute_capability=cc, max_cuda=node.max_cuda,
                          driver_version=node.driver_version)
    assert (choice.image, bool(choice.minor_compat_warning)) == (image, warned)


def test_minor_compat_table_follows_nvidias_guide() -> None:
    from hetero_operator.cluster.cudatable import minor_version_compatible as ok
    assert [ok((11, 8), driver_version=d, max_cuda=None) for d in ("450.80.02", "450.36.06")] == [True, False]
    assert [ok((13, 0), driver_version=d, max_cuda=None) for d in ("580.65.06", "575.51.03")] == [True, False]
    assert ok((11, 8), driver_version="", max_cuda=(11, 4)) is False  # 11.0's 450.36 < 450.80
    assert ok((14, 0), driver_version="999.1", max_cuda=None) is False  # unknown family


def test_plan_warns_for_each_node_that_runs_by_minor_compat() -> None:
    nodes = [make_node("a100", driver="550.107.02", runtime="12.4"),
             make_node("t4", product="Tesla-T4", cc="7.5", memory_mib=15360, driver="570.124.06",
                       runtime="12.8")]
    plan = plan_job(make_job(ranks=2, images=COMPAT_CATALOG), build_inventory(nodes))
    assert isinstance(plan, model.Plan)
    assert [(r.node, r.image) for r in plan.ranks] == [("a100", "reg/w:cu126"), ("t4", "reg/w:cu128")]
    assert [(w.node, w.reason) for w in plan.warnings] == [("a100", "CudaMinorVersionCompatibility")]
    assert "driver 550.107.02 (CUDA <= 12.4)" in plan.warnings[0].message


MIXED_TORCH = [
    _variant("reg/w:cu118", "11.8", ["7.0"], torchVersion="2.7.1"),
    _variant("reg/w:cu128", "12.8", ["7.5", "8.0"], torchVersion="2.13.0"),
]
TORCH_NODES = [make_node("v100", product="Tesla-V100-SXM2-16GB", cc="7.0", memory_mib=16384,
                         driver="535.183.01", runtime="12.2"),
               make_node("t4", product="Tesla-T4", cc="7.5", memory_mib=15360, driver="570.124.06",
                         runtime="12.8")]


def test_plan_with_two_torch_versions_is_refused_naming_variants_and_nodes() -> None:
    result = plan_job(make_job(ranks=2, images=MIXED_TORCH), build_inventory(TORCH_NODES))
    assert isinstance(result, model.Unschedulable)
    assert result.reason == "TorchVersionMismatch"
    assert result.message.startswith(
        "the chosen image variants carry different PyTorch releases, and ranks of one job must run "
        "one PyTorch build: reg/w:cu128 (torchVersion 2.13.0) on t4; reg/w:cu118 (torchVersion "
        "2.7.1) on v100; give every spec.images entry the same torchVersion")


def test_torch_versions_compare_only_the_chosen_variants() -> None:
    # the T4 alone picks only cu128: the other release in the catalog does not matter
    job = make_job(ranks=1, images=MIXED_TORCH, gpus={"allowedProducts": ["Tesla-T4"]})
    assert isinstance(plan_job(job, build_inventory(TORCH_NODES)), model.Plan)
    # a declared release next to an undeclared one is a difference too
    half = [dict(MIXED_TORCH[0], torchVersion=None), MIXED_TORCH[1]]
    half[0].pop("torchVersion")
    result = plan_job(make_job(ranks=2, images=half), build_inventory(TORCH_NODES))
    assert isinstance(result, model.Unschedulable) and "(torchVersion unset) on v100" in result.message
    # no variant declares one: nothing to compare (old catalogs keep planning)
    bare = [{k: v for k, v in m.items() if k != "torchVersion"} for m in MIXED_TORCH]
    assert isinstance(plan_job(make_job(ranks=2, images=bare), build_inventory(TORCH_NODES)), model.Plan)


@pytest.mark.parametrize("bad", ["2.13.0 ", "latest", "v2.13", ""])
def test_torch_version_field_is_validated(bad: str) -> None:
    from hetero_operator.api.errors import SpecError
    manifest = [dict(COMPAT_CATALOG[1], torchVersion=bad)]
    if bad == "":
        assert make_job(images=manifest).images[0].torch_version == ""
        return
    with pytest.raises(SpecError, match=r"spec.images\[0\].torchVersion"):
        make_job(images=manifest)


def test_default_catalog_is_one_torch_release_equal_to_the_example_catalog() -> None:
    from pathlib import Path

    import yaml

    from hetero_operator.api.settings import DEFAULT_IMAGES, parse_images
    example = yaml.safe_load((Path(__file__).resolve().parents[2] / "examples" / "digits.yaml")
                             .read_text())
    assert make_job(images=example["spec"]["images"]).images == DEFAULT_IMAGES
    assert {v.torch_version for v in DEFAULT_IMAGES} == {"2.13.0"}
    assert parse_images("a=12.6=7.0/8.0=2.13.0=minor-compat;b=12.8=9.0") == (
        ImageVariant(image="a", cuda_version=(12, 6), compute_capabilities=("7.0", "8.0"),
                     torch_version="2.13.0", cuda_minor_version_compatible=True),
        ImageVariant(image="b", cuda_version=(12, 8), compute_capabilities=("9.0",)))
    with pytest.raises(ValueError, match="minor-compat"):
        parse_images("a=12.6=7.0=2.13.0=yes")


def test_no_fit_message_names_the_minor_compat_minimum_when_a_variant_opts_in() -> None:
    """cu126 opts in, so a 12.x driver from 525.60.13 runs it: the refusal of a 520 driver names
    that, not cu126's native 560.28 (a new user was sent to upgrade further than needed)."""
    catalog = make_job(images=COMPAT_CATALOG).images
    choice = choose_image(catalog, compute_capability="8.0", max_cuda=(11, 8),
                          driver_version="520.61.05")
    assert choice.message == (
        "driver 520.61.05 supports CUDA <= 11.8; variants with cc 8.0 kernels need CUDA 12.6, 12.8 "
        "(driver >= 525.60.13); add a variant with CUDA <= 11.8 and cc 8.0, or upgrade the driver")
    native = choose_image(catalog, compute_capability="8.0", max_cuda=(12, 4),
                          driver_version="550.107.02")
    assert native.minor_compat_warning.endswith("driver >= 560.28 runs it natively")
