#!/usr/bin/env bash
# Builds the benchmarks' reference into OUT (default: reference-build, git-ignored): sglang 0.5.23's own
# online-c128 kernels for an H200 (sm_90a), compiled ahead of time by sglang's own JIT builder, with the
# sglang Python files that call them (pydsa/bench/reference.py says how). Run it where pydsa is installed
# and nvcc (CUDA 13), ninja and the package registry are; no GPU is needed. Then carry OUT to the
# GPU machine and run the release bench there:
#   python3 -m pip install --no-index --no-deps --target /tmp/site OUT/wheels/*.whl
#   PYTHONPATH=/tmp/site python3 -m pydsa.bench.release results.json --reference-build OUT
set -euo pipefail
OUT=$(mkdir -p "${1:-reference-build}" && cd "${1:-reference-build}" && pwd)
work=$(mktemp -d); trap 'rm -rf "$work"' EXIT
# sglang's wheel (its Python and its kernel sources; none of its dependencies) and tvm-ffi, which its
# modules are built against: one copy for this machine's Python, one for the GPU machine's (CPython 3.12)
python3 -m pip download -q --no-deps --only-binary=:all: sglang==0.5.23 -d "$work"
# tvm-ffi and the three small packages sglang's modules import (msgspec, orjson, psutil) for this machine's Python:
# without msgspec the shim stands in for it and sglang's kernel registry fails at import
python3 -m pip download -q --no-deps --only-binary=:all: apache-tvm-ffi==0.1.11 msgspec==0.23.0 orjson==3.13.0 \
  psutil==7.2.2 -d "$work/tvm-here"
mkdir -p "$OUT/wheels"
# (with the three small packages sglang's modules use at import: msgspec, orjson, psutil)
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_24_x86_64 --platform manylinux_2_17_x86_64 \
  --platform manylinux2014_x86_64 --platform manylinux_2_12_x86_64 -d "$OUT/wheels" \
  apache-tvm-ffi==0.1.11 msgspec==0.23.0 orjson==3.13.0 psutil==7.2.2
(cd "$work" && unzip -q sglang-0.5.23-*.whl 'sglang/*' -x '*.so' -d src)
python3 -m pip install -q --no-deps --target "$work/site" "$work"/tvm-here/*.whl
PYTHONPATH="$work/site${PYTHONPATH:+:$PYTHONPATH}" python3 -m pydsa.bench.reference build "$OUT" --sglang-root "$work/src"
echo "reference built into $OUT"
