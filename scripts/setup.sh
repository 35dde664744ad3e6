#!/usr/bin/env bash
# Set up HeteroTrain on a fresh machine: a virtual environment in .venv with the exact versions of
# requirements.lock and the project. torch==2.13.0 comes from PyPI, whose Linux x86_64 build is the
# CUDA 13.0 one (torch 2.13.0+cu130) with its CUDA libraries as pinned dependencies (nvidia-*,
# cuda-*, triton: about 3 GB to download, 5.8 GB in .venv); it runs on the CPU where no GPU is.
#   bash scripts/setup.sh          # to run jobs (heterotrain run / plan)
#   bash scripts/setup.sh --test   # also the test tools: Prometheus + promtool from Debian
set -euo pipefail
cd "$(dirname "$0")/.."
want_test=0
[ "${1:-}" = "--test" ] && want_test=1

if [ ! -x .venv/bin/python ]; then
  python3 -m venv .venv
fi
.venv/bin/python -m pip install -q --disable-pip-version-check --upgrade pip
# torch first and alone, pinned exactly (its CUDA dependencies are pinned in requirements.lock too).
.venv/bin/python -m pip install -q --disable-pip-version-check "torch==2.13.0"
.venv/bin/python -m pip install -q --disable-pip-version-check -r requirements.lock
.venv/bin/python -m pip install -q --disable-pip-version-check --no-deps -e .

if [ "$want_test" = 1 ]; then
  if ! command -v prometheus >/dev/null || ! command -v promtool >/dev/null; then
    if [ "$(id -u)" = 0 ]; then
      (apt-get install -y -q prometheus >/dev/null 2>&1 || { apt-get update -q >/dev/null && apt-get install -y -q prometheus >/dev/null; })
    else
      sudo apt-get update -q >/dev/null && sudo apt-get install -y -q prometheus >/dev/null
    fi
  fi
  # The Debian package starts a service on :9090 where systemd runs; tests start their own.
  (systemctl stop prometheus >/dev/null 2>&1 || service prometheus stop >/dev/null 2>&1 || true)
  bash scripts/build-controlplane.sh >/dev/null  # real control plane for tests/cluster; fails setup if a binary cannot be built
fi
echo "setup done: .venv ready ($(.venv/bin/python -c 'import torch; print("torch", torch.__version__)'))"
