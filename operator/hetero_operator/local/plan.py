"""``heterotrain plan JOB.yaml --nodes NODES.yaml [--pods PODS.yaml] [-o table|json]``: dry-run placement.

Prints every rank (node, device, image, precision, local batch, expected share of throughput), the
expected speed-up over an equal split, every excluded node with its reason and label warnings, and
notes on what the plan did that the manifest did not say (default images, fewer ranks than asked).
Exit codes: 0 planned, 2 unschedulable, 1 bad input (one line on stderr naming the file or field),
64 usage error (see :mod:`hetero_operator.cli`).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import yaml

from hetero_operator.api import nodelist, podtemplate, prices
from hetero_operator.api.errors import SpecError
from hetero_operator.api.quantities import gib
from hetero_operator.api.pipelineplan import PipelinePlan
from hetero_operator.api.settings import DEFAULT_IMAGES
from hetero_operator.api.spec import KIND, JobSpec, parse_job, profile_key
from hetero_operator.api.types import Plan, Unschedulable, to_dict
from hetero_operator.cluster.dra import merge_dra
from hetero_operator.cluster.inventory import build_inventory
from hetero_operator.planning.placement import pod_tolerations, restrict_to_template
from hetero_operator.local import valueview
from hetero_operator.planning.plan import plan_job

EXIT_PLANNED, EXIT_BAD_INPUT, EXIT_UNSCHEDULABLE = 0, 1, 2
DEFAULT_NODES = Path("examples") / "clusters" / "mixed.yaml"
"""The node list ``plan`` and ``run`` use without ``--nodes`` (1x A100, 1x V100, 2x T4)."""
_REPO_ROOT = Path(__file__).resolve().parents[3]
"""The checkout this module lives in (operator/hetero_operator/local/plan.py -> repo root)."""


class InputError(Exception):
    """Bad input: the message is the one line printed."""


def configure(parser: argparse.ArgumentParser) -> None:
    """Add the ``plan`` arguments."""
    parser.add_argument("job", metavar="JOB.yaml", help="a HeteroTrainingJob manifest")
    parser.add_argument("--nodes", metavar="NODES.yaml", default=None,
                        help="a NodeList (kubectl get nodes -o yaml), a Node, or several Node "
                             f"documents (default: {DEFAULT_NODES}, as heterotrain run)")
    parser.add_argument("--pods", metavar="PODS.yaml", default=None,
                        help="pods already bound to nodes (kubectl get pods -A -o yaml); their GPUs "
                             "count as used")
    parser.add_argument("--dra", metavar="DRA.yaml", action="append", default=[],
                        help="ResourceSlices and ResourceClaims (kubectl get resourceslices,"
                             "resourceclaims -A -o yaml; repeatable): nodes whose GPUs NVIDIA's DRA "
                             "driver publishes are read from their slices, claimed devices are in use")
    parser.add_argument("-o", "--output", choices=("table", "json"), default="table",
                        help="table (default) or json")
    valueview.add_arguments(parser, learn_help="`heterotrain run` writes it, `plan` reads it")


def run(args: argparse.Namespace) -> int:
    """Plan and print; returns the exit code."""
    try:
        job = load_job(Path(args.job))
        nodes = load_objects(Path(args.nodes) if args.nodes else default_nodes_file(), "Node")
        pods = load_objects(Path(args.pods), "Pod") if args.pods else []
        dra_objects = [o for path in args.dra for o in load_dra_objects(Path(path))]
        inputs = valueview.plan_inputs(args, job)
    except (InputError, prices.PriceError) as exc:
        print(f"heterotrain plan: error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    job, notes = with_default_images(job)
    inventory = build_inventory(nodes, pods, tolerations=pod_tolerations(job.worker.template))
    if dra_objects:  # as the operator merges them (controller/planner.py)
        inventory = merge_dra(inventory, [o for o in dra_objects if o.get("kind") == "ResourceSlice"],
                              [o for o in dra_objects if o.get("kind") == "ResourceClaim"]).inventory
    inventory = restrict_to_template(inventory, job.worker.template)
    result = plan_job(job, inventory, inputs=inputs)
    notes = [*notes, *plan_notes(result, job)]
    if args.output == "json":
        print(json.dumps({**to_dict(result), "notes": notes}, indent=2, sort_keys=True))
    else:
        print_result(result, job, notes=notes)
    return EXIT_PLANNED if isinstance(result, Plan) else EXIT_UNSCHEDULABLE


def default_nodes_file() -> Path:
    """``examples/clusters/mixed.yaml`` of this checkout, else of the current directory."""
    for root in (_REPO_ROOT, Path.cwd()):
        if (root / DEFAULT_NODES).is_file():
            return root / DEFAULT_NODES
    return DEFAULT_NODES


def with_default_images(job: JobSpec) -> tuple[JobSpec, list[str]]:
    """The job with the operator's default images when ``spec.images`` is empty, and a note naming
    them (the operator does the same; its ``HTJ_DEFAULT_IMAGES`` setting may name others)."""
    if job.images:
        return job, []
    names = ", ".join(v.image for v in DEFAULT_IMAGES)
    return replace(job, images=DEFAULT_IMAGES), [
        f"spec.images is empty: planned with the operator's default images ({names}); an operator "
        "started with HTJ_DEFAULT_IMAGES uses those instead"]


def plan_notes(result: Plan | Unschedulable, job: JobSpec) -> list[str]:
    """Sentences on a plan that differs from what the manifest asked (fewer ranks), with the reason."""
    if not isinstance(result, Plan) or result.world_size >= job.gpus.ranks:
        return []
    asked, got, batch = job.gpus.ranks, result.world_size, job.training.global_batch_size
    left_out = result.value.left_out if result.value else ()
    if left_out:
        why = (f"spec.gpus.selection Throughput left out {', '.join(f'{lo.devices}x {lo.gpu_type}' for lo in left_out)}"
               " (their predicted gain is below spec.gpus.minGainPercent; see below)")
    elif got == batch and batch < asked:
        why = f"spec.training.globalBatchSize is {batch}, and every rank needs at least one sample"
    else:
        why = (f"only {got} eligible GPU{'s are' if got != 1 else ' is'} free (the excluded nodes "
               "and devices in use are listed below)")
    return [f"{got} of {asked} ranks asked (spec.gpus.ranks): {why}; it plans {got} because "
            f"spec.gpus.minRanks is {job.gpus.min_ranks} (the fewest it may start with). Set "
            f"minRanks to {asked} to wait for all of them instead"]


EMBEDDED_TEMPLATE_FIELDS = ("env",)
"""What ``heterotrain run`` applies of the worker container in ``spec.worker.template``."""


def embedded_template_notes(job: JobSpec) -> list[str]:
    """What the embedded default does with ``spec.worker.template``: the worker container's
    ``env`` (plain values) reaches every rank; everything else describes pods and is ignored on
    one machine (said once, naming the fields)."""
    spec = job.worker.template.get("spec") or {}
    worker = podtemplate.worker_container(job.worker.template)
    ignored = sorted({*(k for k in spec if k != "containers"),
                      *(f"containers[worker].{k}" for k in worker if k not in ("name", *EMBEDDED_TEMPLATE_FIELDS))})
    if job.worker.template.get("metadata"):
        ignored.insert(0, "metadata")
    if not ignored:
        return []
    return [f"spec.worker.template: on this machine the ranks get the worker container's env; "
            f"{', '.join(ignored)} only apply to pods on a cluster and are ignored here"]


# --- input -----------------------------------------------------------------------------------

def read_text(path: Path) -> str:
    """The file's text (UTF-8).

    Raises:
        InputError: in plain words: missing, a directory, not readable, not UTF-8 text.
    """
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise InputError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise InputError(f"{path}: is a directory, not a YAML file") from None
    except PermissionError:
        raise InputError(f"{path}: permission denied (cannot read the file)") from None
    except OSError as exc:
        raise InputError(f"{path}: cannot read the file ({exc.strerror or exc})") from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data[:exc.start].count(b"\n") + 1
        raise InputError(f"{path}: not UTF-8 text (byte 0x{data[exc.start]:02x} on line {line}); "
                         "save it as UTF-8") from None


def load_dra_objects(path: Path) -> list[dict[str, Any]]:
    """The ResourceSlices and ResourceClaims of ``path``: every document, the ``items`` of Lists.

    Raises:
        InputError: unreadable, not YAML, or neither kind in it.
    """
    objs = [i for d in _documents(path) for i in (d["items"] if isinstance(d.get("items"), list) else [d])]
    found = [o for o in objs if isinstance(o, Mapping) and o.get("kind") in ("ResourceSlice", "ResourceClaim")]
    if not found:
        raise InputError(f"{path}: no ResourceSlice or ResourceClaim objects (expected `kubectl get "
                         "resourceslices,resourceclaims -A -o yaml` output)")
    return found


def _documents(path: Path) -> list[Any]:
    text = read_text(path)
    try:
        docs = [d for d in yaml.safe_load_all(text) if d is not None]
    except yaml.YAMLError as exc:
        raise InputError(f"{path}: not valid YAML: {yaml_problem(exc)}") from None
    if not docs or not all(isinstance(d, Mapping) for d in docs):
        raise InputError(f"{path}: expected a YAML mapping (a Kubernetes object)")
    return docs


def yaml_problem(exc: yaml.YAMLError) -> str:
    """The parser's own words with the place, e.g. ``line 3, column 5: mapping values are not
    allowed here``."""
    mark = getattr(exc, "problem_mark", None)
    problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
    context = getattr(exc, "context", None)
    where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark is not None else ""
    return f"{where}{problem}" + (f" ({context})" if context else "")


def load_job(path: Path) -> JobSpec:
    """The first ``HeteroTrainingJob`` document of a file (the first document when none is one).

    Raises:
        InputError: unreadable file, not YAML, or a :class:`SpecError` (message names the field).
    """
    docs = _documents(path)
    body = next((d for d in docs if d.get("kind") == KIND), docs[0])
    try:
        return parse_job(body)
    except SpecError as exc:
        raise InputError(f"{path}: {exc}") from None


def load_objects(path: Path, kind: str) -> list[dict[str, Any]]:
    """Objects of ``kind`` from a List/``<kind>List`` (the first document when it is a list) or
    from the ``kind`` documents of a multi-document file.

    Raises:
        InputError: unreadable, not YAML, or no object of ``kind``.
    """
    docs = _documents(path)
    first = docs[0]
    if isinstance(first.get("items"), list):
        items = [i for i in first["items"] if isinstance(i, Mapping)]
    else:
        items = [d for d in docs if d.get("kind") == kind]
    if not items and kind == "Node":
        raise InputError(f"{path}: items: no Node objects (expected a NodeList, "
                         "`kubectl get nodes -o yaml` output, or Node documents)")
    if kind == "Node":  # a node listed twice would be over-committed (issue 32, F15)
        try:
            nodelist.check_node_names(items)
        except SpecError as exc:
            raise InputError(f"{path}: {exc}") from None
    return items


# --- output ----------------------------------------------------------------------------------

def make_console(**kwargs: Any) -> Any:
    """A rich ``Console`` that raises ``BrokenPipeError`` when its reader went away (rich's own
    handler exits 1), so :func:`hetero_operator.cli.main` ends every subcommand the same way."""
    from rich.console import Console

    class _Console(Console):
        def on_broken_pipe(self) -> None:
            self.quiet = True
            raise BrokenPipeError

    return _Console(**kwargs)


def print_result(result: Plan | Unschedulable, job: JobSpec, console: Any = None, *,
                 notes: Sequence[str] = ()) -> None:
    """Rich tables for a plan or an unschedulable result, then ``notes`` (one ``Note`` line each)."""
    from rich.console import Console
    from rich.table import Table

    console = console or make_console(width=max(140, Console().width))
    if isinstance(result, Plan):
        total_speed = sum(r.relative_speed for r in result.ranks)
        table = Table(title=f"Plan for {job.name}: {_n(result.world_size, 'rank')} on "
                            f"{_n(len(result.nodes), 'node')}, {_n(len(result.groups), 'group')}")
        staged = result.pipeline is not None
        for col in ("rank", "group", "node", "device", "resource", "image", "precision", "batch",
                    "speed %", *(("stage",) if staged else ())):  # speed %: the rank's speed /
            table.add_column(col, overflow="fold", justify="right" if col in (  # the summed speed
                "rank", "group", "batch", "speed %", "stage") else "left")
        for r in result.ranks:
            env = result.groups[r.group].extra_env
            device = r.gpu_type + (f" [{', '.join(f'{k}={v}' for k, v in env.items())}]" if env else "")
            table.add_row(str(r.rank), str(r.group), r.node, device, r.resource_name, r.image or "-",
                          r.precision, str(r.local_batch), f"{100 * r.relative_speed / total_speed:.1f}%",
                          *((str(r.stage),) if staged else ()))
        console.print(table)
        if result.pipeline is not None:
            print_pipeline(result.pipeline, console)
        console.print(f"Expected speed-up over an equal split: "
                      f"{result.expected_speedup_over_equal:.2f}x "
                      f"(global batch {job.training.global_batch_size}, split "
                      f"{job.training.batch_split})")
        valueview.print_value(result.value, console, profile=profile_key(job))
        if result.memory is not None:
            mem = result.memory
            console.print(f"Memory: sharding {mem.mode} (spec.training.sharding {mem.requested}), "
                          f"model state {gib(mem.state_bytes)} "
                          f"({mem.bytes_per_parameter} B per parameter)"
                          + ("; memory labels below 1 GiB: a SCALED-DOWN node list, not a real "
                             "cluster's" if any(r.memory_mib < 1024 for r in result.ranks) else ""),
                          highlight=False)
            for line in mem.reasons:
                console.print(f"  {line}", highlight=False)
        if result.layout is not None:
            console.print(f"Layout: {result.layout.chosen} (spec.training.sharding Auto weighed "
                          "the pipeline against no pipeline)", highlight=False)
            for line in result.layout.reasons:
                console.print(f"  {line}", highlight=False)
    else:
        console.print(f"[bold red]Unschedulable ({result.reason}):[/] {result.message}", highlight=False)
        if result.shortfalls:
            several = len(result.shortfalls) > 1
            table = Table(title="Per GPU type" + (" (need: if every other type were used fully)"
                                                  if several else ""))
            for col in ("GPU type", "need", "free", "why (where its devices are)"):
                table.add_column(col, overflow="fold")
            for s in result.shortfalls:
                table.add_row(s.gpu_type, str(s.need), str(s.free), "; ".join(s.reasons))
            console.print(table)
    for note in notes:
        console.print(f"[bold]Note[/]: {note}", highlight=False)
    _print_excluded(result, console)


def print_pipeline(pipe: PipelinePlan, console: Any) -> None:
    """The stages per GPU type: blocks, ranks, a micro-batch's slot and a rank's memory."""
    from rich.table import Table

    table = Table(title=f"Pipeline: {_n(len(pipe.stages), 'stage')}, "
                        f"{pipe.micro_batches} micro-batches, {pipe.schedule}, bubble "
                        f"{100 * pipe.bubble_fraction:.1f}% of the step")
    for col in ("stage", "GPU type", "ranks", "blocks", "slot s", "memory / rank"):
        table.add_column(col, overflow="fold", justify="left" if col == "GPU type" else "right")
    for s in pipe.stages:
        table.add_row(str(s.index), s.gpu_type, ",".join(map(str, s.ranks)),
                      f"{s.first_block}..{s.first_block + s.blocks - 1} ({s.blocks})",
                      f"{s.slot_s:.4g}", gib(s.memory_bytes))
    console.print(table)


def _n(count: int, noun: str) -> str:
    return f"{count} {noun}{'' if count == 1 else 's'}"


def _print_excluded(result: Plan | Unschedulable, console: Any) -> None:
    from rich.table import Table

    if result.excluded:
        table = Table(title="Excluded nodes")
        for col in ("node", "reason", "message"):
            table.add_column(col, overflow="fold")
        for e in result.excluded:
            table.add_row(e.node, e.reason, e.message)
        console.print(table)
    for w in result.warnings:
        console.print(f"[yellow]Warning[/] {w.node} {w.reason}: {w.message}", highlight=False)
