#!/usr/bin/env bash
# pydsa's set-up in one command, in the active Python environment (a fresh venv is best): torch first when it is
# not there yet (a torch wheel in pip's find-links, else the CPU build; PYDSA_TORCH="torch" takes the default CUDA
# build, or any pip spec), the build tools, pydsa built editable from this clone (nvcc on PATH), then the demo
# (arguments go to it: bash setup.sh --steps 40). The tests then: python -m pytest -q tests
set -euo pipefail
cd "$(dirname "$0")"
if ! python -c "import torch" 2>/dev/null; then
  if [ -n "${PYDSA_TORCH:-}" ]; then
    # shellcheck disable=SC2086
    python -m pip install $PYDSA_TORCH
  else
    # a torch wheel this machine already holds (pip's find-links: a local wheelhouse) is taken as it is; else the
    # CPU build from PyTorch's index
    held=$(mktemp -d)
    version=$(python -m pip download -q --no-deps --no-index torch -d "$held" > /dev/null 2>&1 &&
              find "$held" -name 'torch-*.whl' -printf '%f\n' | sed -n 's/^torch-\([^-]*\)-.*/\1/p' | head -1 || true)
    rm -rf "$held"
    if [ -n "$version" ]; then
      python -m pip install "torch==$version"
    else
      python -m pip install torch --index-url https://download.pytorch.org/whl/cpu
    fi
  fi
fi
python -m pip install cython numpy scikit-build-core ninja hypothesis pytest
python -m pip install --no-build-isolation -e .
python -m pydsa demo "$@"
