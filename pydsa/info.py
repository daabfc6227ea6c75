"""`python -m pydsa info`: what was loaded and what it can run on."""
from __future__ import annotations

import argparse
import os

import torch

from . import _abi


def distribution() -> str | None:
    """The installed distribution that provides this package ("dsa-kernels <version>"), or None: the one
    that declares its sglang plugin entry point (found alike for a wheel and an editable install)."""
    import importlib.metadata as md
    for ep in md.entry_points(group="sglang.srt.plugins"):
        if ep.value.startswith(__package__ + ".") and ep.dist is not None:
            return f"{ep.dist.name} {ep.dist.version}"
    return None


def main(argv=None) -> int:
    argparse.ArgumentParser(prog="python -m pydsa info").parse_args(argv)
    lib = _abi.lib
    print(f"pydsa {lib.dsa_version_string().decode()} (ABI {lib.dsa_abi_version()}), "
          f"distribution: {distribution() or 'none (imported from a source tree, not installed)'}")
    print(f"library: {lib.path}")
    prefix = os.path.dirname(lib.path)
    print(f"C/C++ prefix: {prefix} (CMAKE_PREFIX_PATH={prefix}, PKG_CONFIG_PATH={prefix}/lib/pkgconfig, "
          f"DSA_KERNELS_LIB_DIR={prefix})")
    archs = lib.dsa_cuda_architectures().decode()
    real = [a.split("-")[0] for a in archs.split(",") if a and not a.endswith("-virtual")]
    ptx = [a.split("-")[0] for a in archs.split(",") if a and not a.endswith("-real")]
    print(f"compiled CUDA architectures: {archs or 'none'} (machine code: "
          f"{', '.join('sm_' + a for a in real) or 'none'}; PTX, JIT-compiled by newer GPUs: "
          f"{', '.join('compute_' + a for a in ptx) or 'none'})")
    runtime, driver = lib.dsa_cuda_runtime_version(), lib.dsa_driver_version()
    fmt = lambda v: f"{v // 1000}.{v % 1000 // 10}"  # noqa: E731
    if runtime:
        print(f"CUDA runtime {fmt(runtime)}, linked statically: needs an NVIDIA driver for CUDA {fmt(runtime)} or "
              f"newer; driver found: {fmt(driver) if driver else 'none'}")
    n = lib.dsa_device_count()
    if n == 0:
        print("GPU: none found (ops run on the host backend for CPU tensors)")
    for i in range(n):
        props = torch.cuda.get_device_properties(i) if torch.cuda.is_available() else None
        if props is not None:
            print(f"GPU {i}: {props.name}, sm_{props.major}{props.minor}, {props.total_memory / 2**30:.0f} GiB, "
                  f"{props.multi_processor_count} SMs")
        else:
            print(f"GPU {i}: present (torch sees no CUDA)")
    print(f"torch {torch.__version__}, CUDA available to torch: {torch.cuda.is_available()}")
    return 0
