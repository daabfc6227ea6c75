"""The benchmarks' reference: sglang 0.5.23's own c128 paths (online, and the default offline one), its Python (compress.py,
online_c128_mtp.py) and its CUDA kernels, compiled ahead of time by sglang's own JIT builder.

    python -m pydsa.bench.reference build OUT --sglang-root SRC   # where nvcc is (no GPU needed)

SRC holds the sglang package of the 0.5.23 wheel (unpacked; benchmarks/reference/build.sh fetches it).
The build imports sglang's compress.py and online_c128_mtp.py (pydsa/bench/sglang_shim.py: without
sglang's runtime), sets sglang's JIT target to the H200's (sm_90a, PDL on, as sglang picks on that GPU)
and asks sglang's own module loaders for every module the benchmarks call: the c128 online module
(fp32 and bf16 state), the c128 store module (fp32 vectors, D 512, rope 64, page 2, V4), the MTP
modules, and the default offline c128 path's compress module (fp32 and bf16 ring; fp32 input and output) and planner. sglang's load_jit writes its build file and compiles it with its own flags; the built
libraries, a manifest naming each by sglang's module arguments, and the sglang Python files those
modules import are copied into OUT.

`load(OUT)` (on the GPU machine, with tvm-ffi importable) enters that copy of sglang, redirects its
load_jit to the prebuilt libraries (a module that was not built is an error naming it) and returns a
Reference: sglang's own functions, called as sglang calls them.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys

import torch

from . import sglang_shim

MODULES = ("sglang.kernels.ops.attention.dsv4.compress", "sglang.kernels.ops.attention.dsv4.online_c128_mtp",
           "sglang.kernels.ops.attention.dsv4.kv_layout", "sglang.kernels.jit.utils")
MANIFEST = "manifest.json"
MTP_INDEX_DTYPES = ((torch.int32, torch.int64), (torch.int64, torch.int64), (torch.int32, torch.int32))


def _key(args) -> str:
    return "|".join(str(a) for a in args)


def _enter(root):
    stand_ins = sglang_shim.enter(root)
    return sglang_shim.import_all(MODULES, stand_ins, real=("tvm_ffi",))


PARTS = ("online", "store", "mtp", "offline", "c4")


def cuda_home() -> str:
    """The CUDA toolkit's root: $CUDA_HOME, else what nvcc reports (sglang links its modules against
    its libcudart)."""
    if os.environ.get("CUDA_HOME"):
        return os.environ["CUDA_HOME"]
    import subprocess
    probe = subprocess.run(["nvcc", "--dryrun", "-x", "cu", "-c", os.devnull, "-o", os.devnull],
                           capture_output=True, text=True)
    for line in (probe.stdout + probe.stderr).splitlines():
        if line.startswith("#$ TOP="):
            return os.path.normpath(line[len("#$ TOP="):].strip())  # ".../bin/.."
    raise RuntimeError("nvcc did not report its toolkit's root; set CUDA_HOME")


def build(out: str, sglang_root: str, parts=PARTS) -> dict:
    """Compiles the reference modules of `parts` into `out`; the manifest."""
    unknown = set(parts) - set(PARTS)
    if unknown:
        raise ValueError(f"parts {sorted(unknown)} are not among {PARTS}")
    os.environ["CUDA_HOME"] = cuda_home()
    compress, mtp, kv_layout, jit = _enter(sglang_root)
    from sglang.kernels.jit.utils import arch
    from sglang.kernels.jit.utils.compile import loader
    # the H200's target, as sglang resolves it there (9.0 -> "9.0a"; PDL from sm_90 on)
    arch._CUDA_ARCH = arch.ArchInfo(9, 0, "a")
    arch._init_jit_cuda_arch_once = lambda: None
    os.environ.setdefault("SGLANG_JIT_CACHE_DIR", os.path.join(out, "jit-cache"))
    built = {}

    holding = os.path.join(out, "built")
    os.makedirs(holding, exist_ok=True)

    def keep(library):  # sglang's loader, up to loading the library (no GPU here): a copy is kept
        path = os.path.join(holding, os.path.basename(str(library)))
        shutil.copy2(str(library), path)
        return path

    loader._load = keep
    real_load_jit = loader.load_jit

    def recording(*args, **kwargs):
        built[_key(args)] = real_load_jit(*args, **kwargs)
        return built[_key(args)]

    for module in (compress, mtp):
        module.load_jit = recording
    for state in (torch.float32, torch.bfloat16):
        if "online" in parts:
            compress._jit_compress_128_online_module.__wrapped__(512, state)
        if "mtp" in parts:
            for seq, req in MTP_INDEX_DTYPES:
                mtp._jit_online_c128_mtp_module.__wrapped__(512, seq, req, state)
    if "offline" in parts:  # the release's default c128 path: a 128-row raw ring per request, and its planner
        for ring in (torch.float32, torch.bfloat16):
            compress._jit_compress_module.__wrapped__(512, ring, torch.float32, torch.float32, 128)
        compress._jit_compress_plan_module.__wrapped__()
    if "store" in parts:
        compress._jit_compress_norm_rope_module.__wrapped__(torch.float32, 512, 64, 2, False,
                                                             kv_layout.KVLayout.V4, False)
    if "c4" in parts:  # both compressors of a c4 layer (fp32 and bf16 ring), their stores (page 64), the planner
        for d in (512, 128):
            for state in (torch.float32, torch.bfloat16):
                compress._jit_compress_module.__wrapped__(d, state, torch.float32, torch.float32, 4)
            compress._jit_compress_norm_rope_module.__wrapped__(torch.float32, d, 64, 64, False,
                                                                 kv_layout.KVLayout.V4, False)
        compress._jit_compress_plan_module.__wrapped__()
    libs = os.path.join(out, "lib")
    os.makedirs(libs, exist_ok=True)
    manifest = {}
    for i, (key, path) in enumerate(sorted(built.items())):
        name = f"{i:02d}-{os.path.basename(path)}"
        shutil.move(path, os.path.join(libs, name))
        manifest[key] = name
    # the sglang Python files these modules import (to run them where sglang is not installed)
    src = os.path.join(sglang_root, "sglang")
    for mod in list(sys.modules.values()):
        f = getattr(mod, "__file__", None) or ""
        if mod.__name__.startswith("sglang.") and f.startswith(src) and f.endswith(".py"):
            dest = os.path.join(out, "sglang", os.path.relpath(f, src))
            os.makedirs(os.path.dirname(dest), exist_ok=True)
            shutil.copy2(f, dest)
    for folder in ("include", "csrc"):  # sglang's JIT package looks for its source folders on import
        os.makedirs(os.path.join(out, "sglang", "kernels", "jit", folder), exist_ok=True)
    with open(os.path.join(out, MANIFEST), "w") as fh:
        json.dump({"sglang": "0.5.23", "target": "sm_90a", "modules": manifest}, fh, indent=1)
    for scratch in ("jit-cache", "built"):
        shutil.rmtree(os.path.join(out, scratch), ignore_errors=True)
    return manifest


class Reference:
    """sglang 0.5.23's own calls of the online c128 path (its compress.py and online_c128_mtp.py), over
    the prebuilt kernels. Plans are sglang's own CompressorDecodePlan / CompressorPrefillPlan."""

    def __init__(self, compress, mtp):
        self.compress, self.mtp = compress, mtp

    # compress.py
    def plan_decode(self, seq_lens, req_pool_indices, req_to_token, state_slot_offset=0):
        return self.compress.CompressorDecodePlan.generate_online(seq_lens, req_pool_indices, req_to_token,
                                                                  state_slot_offset)

    def plan_prefill(self, seq_lens, extend_lens, req_pool_indices, req_to_token, num_q_tokens,
                     use_cuda_graph=False, state_slot_offset=0):
        return self.compress.CompressorPrefillPlan.generate_online(seq_lens, extend_lens, req_pool_indices,
                                                                   req_to_token, num_q_tokens, use_cuda_graph,
                                                                   state_slot_offset)

    def extend_plan(self, records):
        """A prefill plan of given compress records (uint8 [N, 16]) and no write records."""
        return self.compress.CompressorPrefillPlan(128, records, records[:0], None)

    def compress_forward(self, state, kv_score, ape, plan, out=None):
        return self.compress.compress_forward(state, kv_score, ape, plan, head_dim=512, compress_ratio=128, out=out,
                                              is_online=True)

    # the default offline c128 path (a 128-row ring of raw kv_score rows per request, slot = request)
    def plan_decode_offline(self, req_pool_indices, seq_lens):
        return self.compress.CompressorDecodePlan.generate_legacy(128, req_pool_indices, seq_lens)

    def plan_prefill_offline(self, req_pool_indices, seq_lens_cpu, extend_lens_cpu, num_q_tokens):
        return self.compress.CompressorPrefillPlan.generate_legacy(128, req_pool_indices, seq_lens_cpu,
                                                                   extend_lens_cpu, num_q_tokens,
                                                                   req_pool_indices.device)

    def compress_forward_offline(self, ring, kv_score, ape, plan, out=None):
        return self.compress.compress_forward(ring, kv_score, ape, plan, head_dim=512, compress_ratio=128, out=out,
                                              is_online=False)

    def store(self, kv, plan, norm_weight, eps, freq_cis, out_loc, kvcache, page_size):
        self.compress.compress_norm_rope_store(kv, plan, norm_weight=norm_weight, norm_eps=eps, freq_cis=freq_cis,
                                               out_loc=out_loc, kvcache=kvcache, page_size=page_size)

    # the c4 layers (both compressors share the plan; sglang's page-scoped ring of R rows per 256-token SWA page)
    def plan_decode_c4(self, req_pool_indices, req_to_token, full_to_swa, seq_lens, ring_size):
        return self.compress.CompressorDecodePlan.generate(4, req_pool_indices, req_to_token, full_to_swa, seq_lens,
                                                           256, ring_size, use_req_ring=False)

    def plan_prefill_c4(self, req_pool_indices, seq_lens_cpu, extend_lens_cpu, req_to_token, full_to_swa, ring_size,
                        num_q_tokens, use_cuda_graph=False):
        return self.compress.CompressorPrefillPlan.generate(4, req_pool_indices, seq_lens_cpu, extend_lens_cpu,
                                                            req_to_token, full_to_swa, 256, ring_size, num_q_tokens,
                                                            use_cuda_graph)

    def compress_forward_c4(self, ring, kv_score, ape, plan, head_dim, out=None):
        return self.compress.compress_forward(ring.view(-1, 4, 4 * head_dim), kv_score, ape, plan, head_dim=head_dim,
                                              compress_ratio=4, out=out, is_online=False)

    # online_c128_mtp.py
    def write_prefix_states(self, kv_score, seq_lens, req_pool_indices, req_to_token, ape, state, batch_size,
                            num_verify_tokens, state_slot_stride):
        self.mtp.online_c128_mtp_write_prefix_states(kv_score, seq_lens, req_pool_indices, req_to_token, ape, state,
                                                     batch_size, num_verify_tokens, state_slot_stride, head_dim=512)

    def mark_pending(self, seq_lens, req_pool_indices, pending, batch_size, num_req_slots, state_dtype):
        self.mtp.online_c128_mtp_mark_pending(seq_lens, req_pool_indices, pending, batch_size, num_req_slots,
                                              head_dim=512, state_dtype=state_dtype)

    def commit_pending(self, seq_lens, req_pool_indices, req_to_token, pending, state, batch_size,
                       num_verify_tokens, state_slot_stride, num_req_slots):
        self.mtp.online_c128_mtp_commit_pending(seq_lens, req_pool_indices, req_to_token, pending, state,
                                                batch_size, num_verify_tokens, state_slot_stride, num_req_slots,
                                                head_dim=512)


def _preload_cudart() -> None:
    """The modules link libcudart.so.13 dynamically, as sglang's JIT modules do: the system's, CUDA_HOME's
    or the copy in torch's nvidia packages, whichever loads first."""
    import ctypes
    import glob
    home = os.environ.get("CUDA_HOME", "/usr/local/cuda")
    candidates = ["libcudart.so.13", *glob.glob(os.path.join(home, "lib64", "libcudart.so.13")),
                  *glob.glob(os.path.join(home, "targets", "*", "lib", "libcudart.so.13"))]
    for base in sys.path:
        candidates += glob.glob(os.path.join(base, "nvidia", "cu13", "lib", "libcudart.so.13"))
        candidates += glob.glob(os.path.join(base, "nvidia", "cuda_runtime", "lib", "libcudart.so.13"))
    for path in candidates:
        try:
            ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
            return
        except OSError:
            continue


def load(folder: str) -> Reference:
    """The reference built into `folder` by build(); sglang's functions over its libraries."""
    with open(os.path.join(folder, MANIFEST)) as fh:
        manifest = json.load(fh)["modules"]
    import tvm_ffi
    _preload_cudart()
    compress, mtp, _, _ = _enter(folder)
    loaded = {}

    def prebuilt(*args, **kwargs):
        key = _key(args)
        if key not in loaded:
            if key not in manifest:
                raise RuntimeError(f"the reference build in {folder} has no module {key!r} (rebuild it: "
                                   f"benchmarks/README.md)")
            loaded[key] = tvm_ffi.load_module(os.path.join(folder, "lib", manifest[key]))
        return loaded[key]

    for module in (compress, mtp):
        module.load_jit = prebuilt
    return Reference(compress, mtp)


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m pydsa.bench.reference", description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="command", required=True)
    b = sub.add_parser("build", help="compile sglang 0.5.23's reference modules into OUT")
    b.add_argument("out")
    b.add_argument("--sglang-root", required=True, help="the folder holding the sglang 0.5.23 package")
    b.add_argument("--only", nargs="+", choices=PARTS, default=list(PARTS), help="build these modules only")
    args = ap.parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    manifest = build(os.path.abspath(args.out), os.path.abspath(args.sglang_root), tuple(args.only))
    print(f"built {len(manifest)} modules into {args.out}")


if __name__ == "__main__":
    main()
