"""Image choice: CUDA <= what the driver supports, kernels for the GPU's compute capability."""

from __future__ import annotations

import pytest
from builders import CATALOG_118_124_128, make_job, make_node
from hypothesis import given, settings
from hypothesis import strategies as st

from hetero_operator import model
from hetero_operator.cuda_table import cuda_for_driver, min_driver_for
from hetero_operator.images import choose_image
from hetero_operator.inventory import build_inventory
from hetero_operator.planning import plan_job
from hetero_operator.spec import ImageVariant

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
