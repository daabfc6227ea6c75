"""sglang 0.5.23 itself: with its wheel installed (without its dependencies: `pip install --no-deps
sglang==0.5.23 msgspec orjson psutil`, as CI does), sglang's own plugin loader finds pydsa's entry
point, applies every hook, and sglang's own compress.py calls, made on CPU tensors, reach pydsa and
give what pydsa's calls give; and sglang's compressor call site runs an offline c128, a c4 and an online c128
layer on pydsa's ops. Runs tests/sglang_wheel.py and tests/sglang_wheel_layers.py, each in a process of its own
(they enter sglang's package without its runtime and stand in for the third-party modules that are not
installed)."""
import importlib.metadata
import json
import pathlib
import subprocess
import sys

import pytest


def _sglang_version():
    try:
        return importlib.metadata.version("sglang")
    except importlib.metadata.PackageNotFoundError:
        return None


@pytest.mark.skipif(_sglang_version() != "0.5.23", reason="sglang 0.5.23's wheel is not installed")
def test_sglangs_loader_applies_the_plugin_and_its_compressor_calls_reach_pydsa(tmp_path):
    script = pathlib.Path(__file__).with_name("sglang_wheel.py")
    r = subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    lines = [line for line in r.stdout.splitlines() if line.startswith("FINDINGS ")]
    assert r.returncode == 0 and lines, r.stdout[-3000:] + r.stderr[-3000:]
    found = json.loads(lines[-1][len("FINDINGS "):])
    assert found["registered"] == found["ours"] and len(found["ours"]) == 13
    assert set(found["ours"]) <= set(found["patched"])  # every target resolved in sglang's modules
    assert all(found["replaced"].values()), found["replaced"]
    for key in ("decode_plan_is_pydsas", "decode_state_equal", "decode_out_equal", "store_equal",
                "prefill_plan_is_pydsas", "prefill_equal", "c4_reached_pydsa", "not_ours_reached_sglang"):
        assert found[key] is True, key
    # sglang's own code stayed sglang's: only third-party modules were stood in for
    assert not any(name.startswith(("sglang", "torch", "pydsa")) for name in found["stand_ins"])


@pytest.mark.skipif(_sglang_version() != "0.5.23", reason="sglang 0.5.23's wheel is not installed")
def test_sglangs_compressor_call_site_runs_every_layer_kind_on_pydsa(tmp_path):
    """sglang's own loader applies the plugin; sglang's compressor call site (forward_unified) then runs an offline
    c128 layer (decode and extend; PYDSA_SGLANG_OFFLINE=1), a c4 layer and an online c128 layer on pydsa's ops (each once, compress and
    store fused: no standalone store), leaving the ring or state and cache bytes of pydsa's own ops on the same
    inputs, with no sglang kernel asked for; a configuration that is not pydsa's (a bf16 store) still reaches
    sglang's kernel, as does an offline c128 layer with PYDSA_SGLANG_OFFLINE=0 (the default). The plugin logs one
    start-up line naming what it hands back."""
    from pydsa.sglang import compress as sglang_v2
    script = pathlib.Path(__file__).with_name("sglang_wheel_layers.py")
    r = subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    lines = [line for line in r.stdout.splitlines() if line.startswith("FINDINGS ")]
    assert r.returncode == 0 and lines, r.stdout[-3000:] + r.stderr[-3000:]
    found = json.loads(lines[-1][len("FINDINGS "):])
    assert found["pydsa_ops"] == {"c128_offline_decode": 1, "c128_offline_extend": 1, "c4_decode": 1,
                                  "c128_decode": 1}, found["pydsa_ops"]
    assert found["sglang_kernels_before_hand_back"] == []
    for key in ("offline_decode_equal", "offline_extend_equal", "c4_decode_equal", "online_plan_is_pydsas",
                "online_decode_equal", "handed_back_reached_sglang", "offline_switched_off_reached_sglang"):
        assert found[key] is True, key
    assert len(found["startup_lines"]) == 1 and "c128 offline" in found["startup_lines"][0]
    assert all(words in found["startup_lines"][0] for words in sglang_v2.HANDED_BACK)
    assert not any(name.startswith(("sglang", "torch", "pydsa")) for name in found["stand_ins"])
