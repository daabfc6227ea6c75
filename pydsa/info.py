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


PACKAGES = ("pydsa", "pyplan")
NAMESAKES = {"pydsa": "a DSA signature library", "pyplan": "a capital-planning tool"}


def _digest(path) -> str:
    import base64
    import hashlib
    with open(path, "rb") as fh:
        return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(fh.read()).digest()).rstrip(b"=").decode()


def replaced_files(dist=None, others=None) -> list:
    """Sentences naming each file of pydsa / pyplan that is not the installed distribution's own (its hash
    differs from the RECORD, it is missing, or another installed distribution also claims it), with the
    repair; [] for an intact install or a source tree. dist / others: the distributions to compare (tests)."""
    import importlib.metadata as md
    if dist is None:
        try:
            dist = md.distribution("dsa-kernels")
        except md.PackageNotFoundError:
            return []
    repair = ("repair: `pip uninstall -y {other}` if you do not need it, then `pip install --force-reinstall "
              "--no-deps dsa-kernels` (or reinstall from the clone)")
    problems = []
    ours = {str(f) for f in dist.files or () if f.parts and f.parts[0] in PACKAGES}
    for f in dist.files or ():
        if str(f) not in ours or not f.hash:
            continue
        path = f.locate()
        if not path.exists():
            problems.append(f"{f} of dsa-kernels is missing; " + repair.format(other="<the package that removed it>"))
        elif _digest(path) != f"{f.hash.mode}={f.hash.value}":
            problems.append(f"{f} is not dsa-kernels' file (another package overwrote it); "
                            + repair.format(other="<the other package>"))
    for other in (md.distributions() if others is None else others):
        name = other.metadata["Name"]
        if name is None or name.lower().replace("_", "-") == "dsa-kernels":
            continue
        clash = sorted({str(f) for f in other.files or ()} & ours)
        if clash:
            what = NAMESAKES.get(clash[0].split("/")[0], "another project")
            problems.append(f"the distribution {name} {other.version} ({what}) also installs {clash[0]}"
                            f"{f' and {len(clash) - 1} more' if len(clash) > 1 else ''}, over dsa-kernels' own; "
                            + repair.format(other=name))
    return problems


def main(argv=None) -> int:
    argparse.ArgumentParser(prog="python -m pydsa info").parse_args(argv)
    problems = replaced_files()
    for p in problems:
        print(f"pydsa info: BROKEN INSTALL: {p}")
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
    return 1 if problems else 0
