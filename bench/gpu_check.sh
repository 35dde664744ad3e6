#!/usr/bin/env bash
# GPU checks of the worker on a machine with one NVIDIA GPU: set-up, then every test marked `gpu`
# (tests/gpu: the real Trainer with NCCL groups of one per rank process on the one card and Gloo
# between the leaders, bf16, fp16 + scaler, work stealing, int8 / PowerSGD on CUDA tensors,
# allocator metrics, kill-and-resume; Group and Full sharding with fp16 + the agreed scaler and a
# sharded checkpoint round trip (tests/gpu/test_gpu_sharded.py, issue 29); plus the NVML/allocator
# gauge checks in tests/worker), a pass/fail table, and a timing: the hierarchy with NCCL in each group and Gloo across against the
# flat layout, 4 rank processes on the GPU (bench/gpu_hierarchy.py, prints the ratio; a figure,
# not a check). Budget: under 7 minutes with set-up on a warm pip cache (tests 300 s, timing 60 s).
#
#   bash bench/gpu_check.sh                 # uses .venv if its torch sees CUDA, else makes .venv-gpu
#   PYTHON=/opt/venv/bin/python bash bench/gpu_check.sh   # an existing interpreter (worker image)
#   TORCH_CUDA=cu126 bash bench/gpu_check.sh              # wheel index for the set-up (default cu128)
#
# Exit code: 0 when every check passed, 1 otherwise (2 when no CUDA GPU is usable).
set -euo pipefail
cd "$(dirname "$0")/.."
start_s=$(date +%s)
OUT=${OUT:-$(mktemp -d)}
TORCH_VERSION=2.13.0  # requirements.lock; one PyTorch build per job
TORCH_CUDA=${TORCH_CUDA:-cu128}

has_cuda() { "$1" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; }

if ! command -v nvidia-smi >/dev/null || ! nvidia-smi -L >/dev/null 2>&1; then
  echo "gpu_check: no NVIDIA GPU visible (nvidia-smi -L failed)" >&2
  exit 2
fi
nvidia-smi --query-gpu=index,name,driver_version,memory.total,pci.bus_id --format=csv,noheader

PY=${PYTHON:-}
if [ -z "$PY" ]; then
  if [ -x .venv/bin/python ] && has_cuda .venv/bin/python; then
    PY=.venv/bin/python
  else
    # Set-up as Dockerfile.worker does it: PyTorch alone from the CUDA variant's index first,
    # then the locked rest and the project without dependencies.
    [ -x .venv-gpu/bin/python ] || python3 -m venv .venv-gpu
    PY=.venv-gpu/bin/python
    if ! has_cuda "$PY"; then
      "$PY" -m pip install -q --disable-pip-version-check \
        --index-url "https://download.pytorch.org/whl/${TORCH_CUDA}" "torch==${TORCH_VERSION}"
    fi
    grep -v '^torch==' requirements.lock > "$OUT/requirements-no-torch.txt"
    "$PY" -m pip install -q --disable-pip-version-check -r "$OUT/requirements-no-torch.txt"
    "$PY" -m pip install -q --disable-pip-version-check --no-deps -e .
  fi
fi
if ! has_cuda "$PY"; then
  echo "gpu_check: $PY has torch without a usable CUDA device" >&2
  exit 2
fi
"$PY" -c 'import torch; print(f"torch {torch.__version__} cuda {torch.version.cuda} nccl", ".".join(map(str, torch.cuda.nccl.version())), "device", torch.cuda.get_device_name(0))'
setup_s=$(( $(date +%s) - start_s ))

set +e
timeout 300 "$PY" -m pytest -m gpu tests/gpu tests/worker/test_metrics_gpu.py \
  tests/worker/test_gpu_identity.py -p no:cacheprovider -q -o addopts="" \
  --junitxml="$OUT/gpu.xml" > "$OUT/pytest.log" 2>&1
rc=$?
set -e
tail -n 30 "$OUT/pytest.log"
# Timing (issue 23): hierarchy with NCCL in each group and Gloo across vs flat, 4 ranks on the GPU.
timeout 60 "$PY" bench/gpu_hierarchy.py || echo "gpu_hierarchy: did not finish (exit $?)"

"$PY" - "$OUT/gpu.xml" "$setup_s" "$(( $(date +%s) - start_s ))" "$rc" <<'EOF'
import sys
import xml.etree.ElementTree as ET
path, setup_s, total_s, rc = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
try:
    cases = list(ET.parse(path).getroot().iter("testcase"))
except (OSError, ET.ParseError):
    cases = []
rows = []
for case in cases:
    outcome = "PASS"
    for tag, name in (("failure", "FAIL"), ("error", "ERROR"), ("skipped", "SKIP")):
        if case.find(tag) is not None:
            outcome = name
    rows.append((case.get("name", "?"), outcome, float(case.get("time", 0))))
width = max([len(r[0]) for r in rows] + [10])
print(f"\n{'check':<{width}}  result  seconds")
for name, outcome, secs in rows:
    print(f"{name:<{width}}  {outcome:<6}  {secs:7.1f}")
passed = sum(r[1] == "PASS" for r in rows)
print(f"\n{passed}/{len(rows)} passed; set-up {setup_s} s, total {total_s} s; pytest exit {rc}")
sys.exit(0 if rows and passed == len(rows) and rc == 0 else 1)
EOF
