#!/usr/bin/env bash
# pydsa's set-up in one command, in the active Python environment (a fresh venv is best): torch first when it is
# not there yet (the CPU build; PYDSA_TORCH="torch" takes the default CUDA build, or any pip spec), the build
# tools, pydsa built editable from this clone (nvcc on PATH), then the demo (arguments go to it:
# bash setup.sh --steps 40). The tests then: python -m pytest -q tests
set -euo pipefail
cd "$(dirname "$0")"
if ! python -c "import torch" 2>/dev/null; then
  # shellcheck disable=SC2086
  python -m pip install ${PYDSA_TORCH:-torch --index-url https://download.pytorch.org/whl/cpu}
fi
python -m pip install cython numpy scikit-build-core ninja hypothesis pytest
python -m pip install --no-build-isolation -e .
python -m pydsa demo "$@"
