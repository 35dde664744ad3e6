#!/usr/bin/env bash
# Build (and optionally push) the HeteroTrain images: the operator and one worker image per CUDA
# variant, all with ONE PyTorch release. The worker tags are the image catalog of
# examples/digits.yaml (and the operator's default catalog): <registry>/worker:<version>-cu126, -cu128.
#
#   scripts/build-images.sh                 # build everything with docker buildx (linux/amd64)
#   scripts/build-images.sh cu128 operator  # only these targets
#   scripts/build-images.sh --push          # build and push
#   scripts/build-images.sh --list          # print the matrix: tag, CUDA, PyTorch, compute capabilities
#   scripts/build-images.sh --dry-run       # print the docker commands without running them
# Environment: REGISTRY (default ghcr.io/heterotrain), VERSION (default: pyproject.toml's version),
# PLATFORM (default linux/amd64), DOCKER (default docker), TORCH_VERSION (default 2.13.0: the
# release requirements.lock pins and the tests run; it applies to EVERY variant).
#
# One PyTorch per job: ranks of different PyTorch builds in one process group are unsupported
# (different NCCL/Gloo, DDP internals, pickling of *_object collectives), so every variant carries
# the same release and the job catalog says so (spec.images[].torchVersion; the planner refuses a
# plan whose chosen variants differ). A variant's image runs on nodes whose driver supports its CUDA
# version (cu126 also on any 12.x driver >= 525.60 through CUDA minor-version compatibility: its
# catalog entry sets cudaMinorVersionCompatible) and whose GPU's compute capability is in its list.
# The lists must equal spec.images[].computeCapabilities of the job catalog.
#   variant  CUDA  base image                                      compute capabilities
set -euo pipefail
cd "$(dirname "$0")/.."

TORCH_VERSION="${TORCH_VERSION:-2.13.0}"
MATRIX=(
  "cu126|12.6|nvidia/cuda:12.6.3-cudnn-runtime-ubuntu22.04|5.0 6.0 7.0 7.5 8.0 8.6 8.9 9.0"
  "cu128|12.8|nvidia/cuda:12.8.1-cudnn-runtime-ubuntu22.04|7.5 8.0 8.6 8.9 9.0 10.0 12.0"
)

REGISTRY="${REGISTRY:-ghcr.io/heterotrain}"
VERSION="${VERSION:-$(sed -n 's/^version = "\(.*\)"$/\1/p' pyproject.toml | head -n1)}"
PLATFORM="${PLATFORM:-linux/amd64}"
DOCKER="${DOCKER:-docker}"
push=0 dry_run=0 list=0 targets=()

usage() { sed -n '2,13p' "$0" | sed 's/^# \{0,1\}//'; }

for arg in "$@"; do
  case "$arg" in
    --push) push=1 ;;
    --dry-run) dry_run=1 ;;
    --list) list=1 ;;
    -h|--help) usage; exit 0 ;;
    operator|cu126|cu128) targets+=("$arg") ;;
    *) echo "build-images.sh: unknown argument '$arg' (see --help)" >&2; exit 2 ;;
  esac
done
[ "${#targets[@]}" -eq 0 ] && targets=(operator cu126 cu128)
[ -n "$VERSION" ] || { echo "build-images.sh: cannot read the version from pyproject.toml" >&2; exit 1; }

if [ "$list" = 1 ]; then
  printf '%-45s %-5s %-7s %s\n' "tag" "CUDA" "PyTorch" "compute capabilities"
  for row in "${MATRIX[@]}"; do
    IFS='|' read -r variant cuda _base ccs <<<"$row"
    printf '%-45s %-5s %-7s %s\n' "$REGISTRY/worker:$VERSION-$variant" "$cuda" "$TORCH_VERSION" "$ccs"
  done
  exit 0
fi

run() {
  if [ "$dry_run" = 1 ]; then
    printf '%q ' "$@"; echo
  else
    "$@"
  fi
}

output=(--load)
[ "$push" = 1 ] && output=(--push)

for target in "${targets[@]}"; do
  if [ "$target" = operator ]; then
    run "$DOCKER" buildx build --platform "$PLATFORM" -f Dockerfile.operator \
      -t "$REGISTRY/operator:$VERSION" "${output[@]}" .
    continue
  fi
  for row in "${MATRIX[@]}"; do
    IFS='|' read -r variant _cuda base ccs <<<"$row"
    [ "$variant" = "$target" ] || continue
    run "$DOCKER" buildx build --platform "$PLATFORM" -f Dockerfile.worker \
      --build-arg "CUDA_IMAGE=$base" --build-arg "TORCH_CUDA=$variant" \
      --build-arg "TORCH_VERSION=$TORCH_VERSION" --build-arg "COMPUTE_CAPABILITIES=$ccs" \
      -t "$REGISTRY/worker:$VERSION-$variant" "${output[@]}" .
  done
done
