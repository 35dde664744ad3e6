"""Unschedulable messages that name the real cause (issue 22, point 6): a short product name in
``allowedProducts`` gets "did you mean", a product no node has is said to be absent; and what would
plan (point 7): the GPU type that alone holds the model with the spec change (checked by planning
it), the smallest GPU of the table that holds it, Full sharding's rank count, the ``minMemoryMiB``
that plans, each said once."""

from __future__ import annotations

import copy
from pathlib import Path

import yaml

from builders import make_node

from hetero_operator.api.spec import parse_job
from hetero_operator.api.types import Plan, Unschedulable
from hetero_operator.cluster.inventory import build_inventory
from hetero_operator.local.plan import load_objects
from hetero_operator.planning.memory import FULL_COMPRESSION_WHY
from hetero_operator.planning.plan import plan_job

ROOT = Path(__file__).parents[2]
DIGITS = yaml.safe_load((ROOT / "examples" / "digits.yaml").read_text())
NODES = load_objects(ROOT / "examples" / "clusters" / "mixed.yaml", "Node")


def _plan(allowed: list[str]) -> Unschedulable:
    doc = copy.deepcopy(DIGITS)
    doc["spec"]["gpus"].update(allowedProducts=allowed, minRanks=1)
    result = plan_job(parse_job(doc), build_inventory(NODES))
    assert isinstance(result, Unschedulable)
    return result


def test_a_short_product_name_gets_did_you_mean_the_full_one():
    result = _plan(["A100"])
    a100 = next(e for e in result.excluded if e.node == "node-a100")
    assert a100.message == (
        "NVIDIA-A100-SXM4-40GB is not in spec.gpus.allowedProducts; A100 matches no product: the "
        "list takes full product names as GPU Feature Discovery labels them "
        "(nvidia.com/gpu.product): did you mean NVIDIA-A100-SXM4-40GB?")
    t4 = next(e for e in result.excluded if e.node == "node-t4")
    assert t4.message == "Tesla-T4 is not in spec.gpus.allowedProducts"


def test_a_product_no_node_has_is_named_as_absent():
    result = _plan(["NVIDIA-H100-80GB-HBM3"])
    assert ("To plan: add 1 NVIDIA-H100-80GB-HBM3 GPU: no node has one of "
            "spec.gpus.allowedProducts (the nodes have NVIDIA-A100-SXM4-40GB, Tesla-T4, "
            "Tesla-V100-SXM2-16GB); or allow") in result.message


INT8 = {"mode": "Int8"}
"""Compression: what Full sharding does not build (fp16 ranks and checkpoints are built, issue 29),
so that a model only Full holds stays unplanned and the messages below name the rest."""


def _digits(**training: object) -> dict:
    doc = copy.deepcopy(DIGITS)
    doc["spec"]["training"].update(training)
    return doc


def _unschedulable(doc: dict, nodes: list | None = None) -> Unschedulable:
    result = plan_job(parse_job(doc), build_inventory(NODES if nodes is None else nodes))
    assert isinstance(result, Unschedulable)
    return result


def test_too_little_memory_on_every_node_names_the_min_memory_that_plans_once():
    doc = copy.deepcopy(DIGITS)
    doc["spec"]["gpus"]["minMemoryMiB"] = 50000
    result = _unschedulable(doc)
    assert result.message.count("minMemoryMiB") == 2  # the GPUs to add, the value that plans
    assert result.message.endswith(
        "To plan: add 2 GPUs of at least 50000 MiB (spec.gpus.minMemoryMiB); or set "
        "spec.gpus.minMemoryMiB to 16384 (what Tesla-V100-SXM2-16GB has): it would plan 2 ranks")
    doc["spec"]["gpus"]["minMemoryMiB"] = 16384  # what it says plans, plans
    assert isinstance(plan_job(parse_job(doc), build_inventory(NODES)), Plan)


def test_min_memory_excluding_some_types_never_suggests_adding_one_of_them():
    doc = copy.deepcopy(DIGITS)
    doc["spec"]["gpus"]["minMemoryMiB"] = 20000
    result = _unschedulable(doc)
    assert result.message.endswith(
        "To plan: set spec.gpus.minRanks to 1 or less; or add 1 more NVIDIA-A100-SXM4-40GB GPU (a "
        "node, or free used ones); or set spec.gpus.minMemoryMiB to 16384 (what "
        "Tesla-V100-SXM2-16GB has): it would plan 2 ranks")


def test_min_memory_that_no_tried_value_plans_names_the_field_once():
    doc = copy.deepcopy(DIGITS)
    doc["spec"]["gpus"].update(minMemoryMiB=50000, ranks=8, minRanks=8)  # 4 GPUs in all
    result = _unschedulable(doc)
    assert result.message.count("lower spec.gpus.minMemoryMiB") == 1
    assert result.message.endswith(
        "or lower spec.gpus.minMemoryMiB from 50000 (NVIDIA-A100-SXM4-40GB has 40960 MiB; 2 more "
        "nodes with less)")


def test_a_model_only_the_a100_holds_names_the_change_that_plans_it():
    doc = _digits(model={"parameters": "1.5G"}, optimizer="AdamW", compression=INT8)
    result = _unschedulable(doc)
    assert result.reason == "ModelDoesNotFit"
    assert result.message.endswith(
        "or add GPUs with more memory: at least an NVIDIA-GeForce-RTX-5090 (31.8 GiB) per rank "
        "holds the whole state (the smallest such GPU in the built-in table). Or: "
        "NVIDIA-A100-SXM4-40GB alone holds the whole state: spec.gpus.allowedProducts "
        "[NVIDIA-A100-SXM4-40GB] and spec.gpus.minRanks 1 would plan (1 rank, sharding None)")
    doc["spec"]["gpus"].update(allowedProducts=["NVIDIA-A100-SXM4-40GB"], minRanks=1)
    planned = plan_job(parse_job(doc), build_inventory(NODES))  # what it says plans, plans
    assert isinstance(planned, Plan) and planned.world_size == 1 and planned.memory.mode == "None"


def test_an_explicit_mode_that_does_not_fit_names_the_type_that_holds_it_too():
    doc = _digits(model={"parameters": "1.5G"}, optimizer="AdamW", sharding="None",
                  compression=INT8)
    assert _unschedulable(doc).message.endswith(
        "no sharding mode fits either: lower spec.training.model.parameters or the batch's "
        "activations, use an optimizer with less state, or add GPUs with more memory (at least an "
        "NVIDIA-GeForce-RTX-5090 (31.8 GiB) per rank holds the whole state (the smallest such GPU "
        "in the built-in table)). Or: NVIDIA-A100-SXM4-40GB alone holds the whole state: "
        "spec.gpus.allowedProducts [NVIDIA-A100-SXM4-40GB] and spec.gpus.minRanks 1 would plan "
        "(1 rank, sharding None)")
    # where another mode fits every rank, that is the fix: no second one
    doc["spec"]["training"]["precision"] = "FP32"
    del doc["spec"]["training"]["compression"]
    assert _unschedulable(doc).message.endswith(
        "set spec.training.sharding to Auto (it would choose Full)")


def test_a_model_no_gpu_here_holds_names_the_smallest_gpu_of_the_table_that_does():
    result = _unschedulable(_digits(model={"parameters": "3G"}, optimizer="AdamW", compression=INT8))
    assert result.message.endswith(
        "or add GPUs with more memory: at least an NVIDIA-H100-80GB-HBM3 (79.6 GiB) per rank "
        "holds the whole state (the smallest such GPU in the built-in table)")
    assert "Or:" not in result.message  # no type here holds it alone


def test_30g_parameters_name_the_largest_gpu_and_how_many_full_sharding_needs():
    doc = _digits(model={"parameters": "30G"}, optimizer="AdamW", precision="FP32")
    del doc["spec"]["training"]["checkpoint"]  # Full sharding does not checkpoint yet
    result = _unschedulable(doc)
    assert result.message.endswith(
        "or add GPUs with more memory: no GPU of the built-in table holds the whole state (the "
        "largest, NVIDIA-B200, has 169.1 GiB usable), or spec.training.sharding Full over at least "
        "13 NVIDIA-A100-SXM4-40GB ranks (37.0 GiB usable each)")
    doc["spec"]["gpus"].update(ranks=13, minRanks=13)
    doc["spec"]["training"]["sharding"] = "Full"
    a100s = [make_node(f"a100-{i:02d}") for i in range(13)]
    planned = plan_job(parse_job(doc), build_inventory(a100s))  # 13 hold it
    assert isinstance(planned, Plan) and planned.memory.mode == "Full"
    doc["spec"]["gpus"].update(ranks=12, minRanks=12)
    assert _unschedulable(doc, a100s[:12]).reason == "ModelDoesNotFit"  # 12 do not


def test_30g_parameters_name_full_shardings_rank_count_with_what_full_needs_for_the_job():
    result = _unschedulable(_digits(model={"parameters": "30G"}, compression=INT8))
    assert result.message.endswith(  # fp16 ranks and checkpoints: built under Full (issue 29)
        "(the largest, NVIDIA-B200, has 169.1 GiB usable), or spec.training.sharding Full over at "
        "least 13 NVIDIA-A100-SXM4-40GB ranks (37.0 GiB usable each; Full also needs: leave "
        "spec.training.compression out)")


def test_every_gpu_table_row_is_named_by_a_product_label_that_reads_back_as_that_row():
    from hetero_operator.cluster.gputable import GPU_MODELS, PRODUCT_LABELS, lookup_model
    assert set(PRODUCT_LABELS) == {g.name for g in GPU_MODELS}
    assert {name: lookup_model(label).name for name, label in PRODUCT_LABELS.items()} == {
        name: name for name in PRODUCT_LABELS}


# --- following the suggestions ends in a plan (issue 22, point 7: they went in a circle) --------

def test_a_fitting_mode_not_built_for_the_job_names_every_change_that_plans_it_checked():
    doc = _digits(model={"parameters": "3G"}, compression=INT8)  # precision Auto, checkpoints
    result = _unschedulable(doc)
    assert result.message == (
        "spec.training.sharding Auto: no sharding mode fits model state 44.7 GiB (3,000,000,000 "
        "parameters x 16 B: fp32 parameters and gradients, AdamW state): None: "
        "NVIDIA-A100-SXM4-40GB short by 7.7 GiB (37.0 GiB usable); Tesla-T4 short by 31.5 GiB "
        "(13.2 GiB usable); Tesla-V100-SXM2-16GB short by 30.5 GiB (14.2 GiB usable); Group: "
        "NVIDIA-A100-SXM4-40GB short by 7.7 GiB (37.0 GiB usable); Tesla-T4 short by 9.1 GiB "
        "(13.2 GiB usable); Tesla-V100-SXM2-16GB short by 30.5 GiB (14.2 GiB usable); Full: fits, "
        f"but Full sharding is not built with compression ({FULL_COMPRESSION_WHY}) yet: it plans "
        "if spec.training.compression is left out (checked: 4 ranks, sharding Full); lower "
        "spec.training.model.parameters, give "
        "spec.training.model.checkpointedActivationBytesPerSample, use an optimizer with less "
        "state (SGD), or add GPUs with more memory: at least an NVIDIA-H100-80GB-HBM3 (79.6 GiB) "
        "per rank holds the whole state (the smallest such GPU in the built-in table)")
    assert "BF16" not in result.message  # the T4 and the V100 have no bf16
    del doc["spec"]["training"]["compression"]  # what it says plans, plans (fp16, checkpoints)
    planned = plan_job(parse_job(doc), build_inventory(NODES))
    assert isinstance(planned, Plan) and planned.world_size == 4 and planned.memory.mode == "Full"


def test_a_precision_some_types_lack_is_one_hint_naming_them_all_checked():
    doc = _digits(model={"parameters": "3G"}, precision="BF16", compression=INT8)
    result = _unschedulable(doc)
    assert result.message.count("spec.training.precision") == 2
    assert ("To plan: set spec.gpus.minRanks to 1 or less (checked: that alone does not plan: "
            "ModelDoesNotFit); or add 1 more NVIDIA-A100-SXM4-40GB GPU") in result.message
    assert result.message.endswith(
        "or use spec.training.precision Auto or FP32 (Tesla-T4 (cc 7.5), Tesla-V100-SXM2-16GB (cc "
        "7.0) have no bf16; spec.training.precision BF16 needs cc >= 8.0) (checked: neither plans "
        "with the rest of the spec as it stands; planning with it names what else to change)")
    del doc["spec"]["training"]["compression"]  # what Full sharding also needs
    assert _unschedulable(doc).message.endswith(
        "BF16 needs cc >= 8.0) (checked: Auto plans 4 ranks, sharding Full)")  # fp16 under Full: issue 29


def test_a_short_name_no_node_has_gets_did_you_mean_from_the_gpu_table():
    result = _plan(["H100"])
    assert result.message.endswith(
        "To plan: add 1 H100 GPU: no node has one of spec.gpus.allowedProducts (the nodes have "
        "NVIDIA-A100-SXM4-40GB, Tesla-T4, Tesla-V100-SXM2-16GB) (H100 is not a product name as "
        "GPU Feature Discovery labels it (nvidia.com/gpu.product): did you mean "
        "NVIDIA-H100-80GB-HBM3, NVIDIA-H100-NVL or NVIDIA-H100-PCIe?); or allow "
        "NVIDIA-A100-SXM4-40GB, Tesla-T4, Tesla-V100-SXM2-16GB in spec.gpus "
        "(NVIDIA-A100-SXM4-40GB, Tesla-T4, Tesla-V100-SXM2-16GB are not in "
        "spec.gpus.allowedProducts)")
    assert "did you mean" not in _plan(["NVIDIA-H100-80GB-HBM3"]).message  # a full label
