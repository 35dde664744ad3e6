"""Shared case 53 (issue 32, item 8): a Grace Hopper node (GH200, ``kubernetes.io/arch=arm64``)
next to x86 H100 nodes.  The image per node is chosen by platform as well as by CUDA and compute
capability: ``spec.images[].platforms`` (default linux/amd64) against the node's
``kubernetes.io/os``/``kubernetes.io/arch``; a node no variant is built for is left out of the plan
with ``NoCompatibleImage`` naming its platform and the field to fix.

The case's jobs use a placeholder schema (``image.cudaVariants``, ``hetero.example.io``); each test
maps them onto ``spec.images``.
"""

from __future__ import annotations

import copy
import functools
import re
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import yaml
from builders import make_job

from hetero_operator.api import platforms
from hetero_operator.api import types as model
from hetero_operator.api.errors import SpecError
from hetero_operator.api.settings import DEFAULT_IMAGES
from hetero_operator.api.spec import parse_job
from hetero_operator.cluster.inventory import build_inventory
from hetero_operator.planning.images import choose_image
from hetero_operator.planning.plan import plan_job

REPO = Path(__file__).resolve().parents[2]
CASE = REPO / "tests" / "fixtures" / "cases" / "53-grace-hopper-arm64-image-arch.yaml"
CRD = REPO / "crds" / "heterotrainingjobs.heterotrain.io.yaml"


def case_docs() -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(CASE.read_text()) if d is not None]


def case_nodes(arch_b: str | None = "arm64") -> list[dict[str, Any]]:
    """node-a (4 x H100, amd64) and node-b (1 x GH200, ``arch_b``; None drops the label)."""
    nodes = copy.deepcopy(case_docs()[0]["items"])
    for n in nodes:
        n["status"].setdefault("conditions", [{"type": "Ready", "status": "True"}])
        if n["metadata"]["name"] == "node-b":
            if arch_b is None:
                del n["metadata"]["labels"][platforms.ARCH_LABEL]
            else:
                n["metadata"]["labels"][platforms.ARCH_LABEL] = arch_b
    return nodes


def images_of(job_doc: dict[str, Any]) -> list[dict[str, Any]]:
    """The case's ``image.cudaVariants`` as ``spec.images`` entries."""
    out = []
    for v in job_doc["spec"]["image"]["cudaVariants"]:
        entry = {"image": v["image"], "cudaVersion": v["cuda"], "computeCapabilities": v["cc"]}
        if "platforms" in v:
            entry["platforms"] = v["platforms"]
        out.append(entry)
    return out


def job_of(index: int, **kwargs: Any) -> Any:
    """The case's job ``index`` (1: gh200, 2: gh200-multiarch): 5 ranks, minRanks 1."""
    doc = case_docs()[index]
    return make_job(ranks=doc["spec"]["ranks"], min_ranks=doc["spec"]["minRanks"], global_batch=60,
                    images=kwargs.pop("images", images_of(doc)), **kwargs)


def images_per_node(plan: Any) -> dict[str, set[str]]:
    assert isinstance(plan, model.Plan), getattr(plan, "message", plan)
    out: dict[str, set[str]] = {}
    for r in plan.ranks:
        out.setdefault(r.node, set()).add(r.image)
    return out


def ranks_on(plan: model.Plan, node: str) -> int:
    return sum(1 for r in plan.ranks if r.node == node)


# --- the case --------------------------------------------------------------------------------

def test_an_amd64_only_image_gets_no_rank_on_the_gh200_and_the_plan_names_arm64() -> None:
    expected = case_docs()[3]["expected"]["gh200"]
    plan = plan_job(job_of(1), build_inventory(case_nodes()))
    assert images_per_node(plan) == {"node-a": {"registry.example.com/train:cu128"}}
    assert ranks_on(plan, "node-b") == expected["ranks_on_node-b_with_amd64_only_image"] == 0
    assert plan.world_size == 4
    (gone,) = [e for e in plan.excluded if e.node == "node-b"]
    assert gone.reason == model.NO_COMPATIBLE_IMAGE
    assert expected["node-b_message_contains"] in gone.message
    assert gone.message == (
        "no image variant is built for linux/arm64, this node's platform (labels kubernetes.io/os, "
        "kubernetes.io/arch); spec.images has linux/amd64 (an entry without platforms is "
        "linux/amd64): add a variant built for linux/arm64 listing it in spec.images[].platforms "
        "(a multi-arch image lists every platform it has), or keep the job off such nodes (a "
        "nodeSelector on kubernetes.io/arch in spec.worker.template)")


def test_the_operators_default_images_are_amd64_and_leave_the_gh200_out() -> None:
    assert {v.platforms for v in DEFAULT_IMAGES} == {("linux/amd64",)}
    job = make_job(ranks=5, min_ranks=1, global_batch=60)
    plan = plan_job(replace(job, images=DEFAULT_IMAGES), build_inventory(case_nodes()))
    assert set(images_per_node(plan)) == {"node-a"}
    assert [e.reason for e in plan.excluded if e.node == "node-b"] == [model.NO_COMPATIBLE_IMAGE]


def test_an_amd64_and_an_arm64_variant_each_go_to_their_node() -> None:
    expected = case_docs()[3]["expected"]["gh200-multiarch"]
    plan = plan_job(job_of(2), build_inventory(case_nodes()))
    assert images_per_node(plan) == {node: {image} for node, image in expected.items()}
    assert (ranks_on(plan, "node-a"), ranks_on(plan, "node-b")) == (4, 1)
    assert not [e for e in plan.excluded if e.node == "node-b"]


def test_one_multi_arch_image_listing_both_platforms_runs_on_both_nodes() -> None:
    images = [{"image": "reg/train:cu128", "cudaVersion": "12.8", "computeCapabilities": ["9.0"],
               "platforms": ["linux/amd64", "linux/arm64/v8"]}]
    plan = plan_job(job_of(1, images=images), build_inventory(case_nodes()))
    assert images_per_node(plan) == {"node-a": {"reg/train:cu128"}, "node-b": {"reg/train:cu128"}}


def test_control_the_gh200_relabelled_amd64_gets_its_rank() -> None:
    plan = plan_job(job_of(1), build_inventory(case_nodes(arch_b="amd64")))
    assert (ranks_on(plan, "node-a"), ranks_on(plan, "node-b")) == (4, 1)


def test_a_node_without_the_arch_label_takes_any_variant_as_before() -> None:
    plan = plan_job(job_of(2), build_inventory(case_nodes(arch_b=None)))
    assert images_per_node(plan) == {"node-a": {"registry.example.com/train:cu128-amd64"},
                                     "node-b": {"registry.example.com/train:cu128-amd64"}}


def test_platform_is_checked_before_cuda_and_the_cuda_message_names_only_fitting_variants() -> None:
    catalog = parse_job(_manifest([
        {"image": "new-arm", "cudaVersion": "13.0", "computeCapabilities": ["9.0"], "platforms": ["linux/arm64"]},
        {"image": "old-amd", "cudaVersion": "12.8", "computeCapabilities": ["9.0"]}])).images
    arm = choose_image(catalog, compute_capability="9.0", max_cuda=(12, 8), platform="linux/arm64")
    assert not arm.ok and "variants with cc 9.0 kernels need CUDA 13.0 (driver" in arm.message  # not 12.8's amd64
    amd = choose_image(catalog, compute_capability="9.0", max_cuda=(13, 0), platform="linux/amd64")
    assert amd.image == "old-amd"
    assert choose_image(catalog, compute_capability="9.0", max_cuda=(13, 0), platform=None).image == "new-arm"


# --- the field -------------------------------------------------------------------------------

def _manifest(images: list[dict[str, Any]]) -> dict[str, Any]:
    body = yaml.safe_load((REPO / "examples" / "digits.yaml").read_text())
    body["spec"]["images"] = images
    return body


def _one(platform_list: Any) -> dict[str, Any]:
    return _manifest([{"image": "reg/w:1", "cudaVersion": "12.8", "computeCapabilities": ["9.0"],
                       "platforms": platform_list}])


def test_platforms_parse_default_to_amd64_and_drop_repeats() -> None:
    (left_out,) = parse_job(_manifest([{"image": "reg/w:1", "cudaVersion": "12.8",
                                        "computeCapabilities": ["9.0"]}])).images
    assert left_out.platforms == ("linux/amd64",)
    (given,) = parse_job(_one(["linux/arm64", "linux/amd64", "linux/arm64"])).images
    assert given.platforms == ("linux/arm64", "linux/amd64")


@pytest.mark.parametrize(("value", "message"), [
    (["linux/x86_64"], "spec.images[0].platforms[0]: unknown architecture 'x86_64' in 'linux/x86_64'; "
                       "Kubernetes and OCI call it amd64: write \"linux/amd64\" (the node label kubernetes.io/arch)"),
    (["linux/aarch64"], "spec.images[0].platforms[0]: unknown architecture 'aarch64' in 'linux/aarch64'; "
                        "Kubernetes and OCI call it arm64: write \"linux/arm64\""),
    (["linux/amd64", "arm64"], "spec.images[0].platforms[1]: must be os/arch[/variant] such as "
                               "\"linux/amd64\" or \"linux/arm64\", got 'arm64'; did you mean \"linux/arm64\"?"),
    (["darwin/arm64"], "spec.images[0].platforms[0]: unknown os 'darwin' in 'darwin/arm64'; use one of linux, windows"),
    (["linux/arm64/V8"], "spec.images[0].platforms[0]: the variant of 'linux/arm64/V8' must be 1-8 lowercase"),
    ([], "spec.images[0].platforms: must be a non-empty list"),
    ("linux/amd64", "spec.images[0].platforms: must be a non-empty list"),
    ([7], "spec.images[0].platforms[0]: entries are strings such as \"linux/arm64\", got 7"),
])
def test_a_bad_platform_is_refused_naming_the_entry_and_the_fix(value: Any, message: str) -> None:
    with pytest.raises(SpecError) as err:
        parse_job(_one(value))
    assert str(err.value).startswith(message), str(err.value)


@functools.lru_cache(maxsize=1)
def _crd_platform_pattern() -> re.Pattern[str]:
    crd = yaml.safe_load(CRD.read_text())
    schema = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    field = schema["properties"]["spec"]["properties"]["images"]["items"]["properties"]["platforms"]
    (rule,) = field["x-kubernetes-validations"]
    return re.compile(re.search(r"p\.matches\('([^']+)'\)", rule["rule"]).group(1))


@pytest.mark.parametrize("value", ["linux/amd64", "linux/arm64", "linux/arm64/v8", "linux/ppc64le",
                                   "windows/amd64", "linux/x86_64", "linux/aarch64", "arm64",
                                   "darwin/arm64", "linux/arm64/V8", "linux//amd64", "linux/amd64/v1/x"])
def test_the_crd_rule_and_the_parser_agree(value: str) -> None:
    """The API server's CEL rule admits exactly what the operator's parser admits."""
    try:
        platforms.parse_platform(value, "p")
        parsed = True
    except ValueError:
        parsed = False
    assert bool(_crd_platform_pattern().match(value)) is parsed
