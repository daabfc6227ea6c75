"""The benchmarks' reference build (pydsa/bench/reference.py): sglang 0.5.23's own JIT builder compiles
its c128 store module ahead of time for the H200's target, and the loader resolves sglang's own module
request to that library. Needs sglang 0.5.23's wheel, tvm-ffi and nvcc (CI installs the first two);
skipped elsewhere. Run in a subprocess: the sglang shim takes over `sglang` in sys.modules."""
import importlib.util
import shutil
import subprocess
import sys
import textwrap

import pytest


def _sglang_0523():
    try:
        from importlib.metadata import version
        return version("sglang") == "0.5.23"
    except Exception:
        return False


pytestmark = pytest.mark.skipif(
    not (_sglang_0523() and importlib.util.find_spec("tvm_ffi") and shutil.which("nvcc")),
    reason="needs sglang 0.5.23's wheel, apache-tvm-ffi and nvcc")

SCRIPT = textwrap.dedent('''
    import importlib.util, json, os, sys
    import torch
    from pydsa.bench import reference
    out = sys.argv[1]
    root = os.path.dirname(importlib.util.find_spec("sglang").submodule_search_locations[0])
    manifest = reference.build(out, root, ("store",))
    key = "dpsk_v4_fused_norm_rope_v2|fp32_t|512|64|2|0|false|V4|true"
    assert list(manifest) == [key], manifest
    assert os.path.exists(os.path.join(out, "lib", manifest[key]))
    assert os.path.exists(os.path.join(out, "sglang", "kernels", "ops", "attention", "dsv4", "compress.py"))
    with open(os.path.join(out, "manifest.json")) as f:
        assert json.load(f)["target"] == "sm_90a"
    ref = reference.load(out)
    from sglang.kernels.jit.utils import arch
    arch._CUDA_ARCH = arch.ArchInfo(9, 0, "a")  # what sglang resolves on an H200
    arch._init_jit_cuda_arch_once = lambda: None
    kv_layout = sys.modules["sglang.kernels.ops.attention.dsv4.kv_layout"]
    module = ref.compress._jit_compress_norm_rope_module(torch.float32, 512, 64, 2, False, kv_layout.KVLayout.V4)
    assert hasattr(module, "forward"), module
    try:
        ref.compress._jit_compress_128_online_module(512, torch.float32)
    except RuntimeError as exc:
        assert "has no module 'dpsk_v4_compress_128_online_v2|512|fp32_t|true'" in str(exc), exc
    else:
        raise AssertionError("a module the build did not make was found")
    print("REFERENCE OK")
''')


def test_the_reference_build_compiles_sglangs_module_and_the_loader_finds_it(tmp_path):
    run = subprocess.run([sys.executable, "-c", SCRIPT, str(tmp_path / "ref")], capture_output=True, text=True,
                         timeout=900)
    assert run.returncode == 0 and "REFERENCE OK" in run.stdout, run.stdout[-3000:] + run.stderr[-3000:]
