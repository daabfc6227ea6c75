"""What a new user meets first: odd demo flags, silent acceptances turned into named errors, and the sglang
layer's errors in sglang's own argument names (the shapes the caller passed, not pydsa's reshaped ones)."""
import json
import subprocess
import sys

import numpy as np
import pytest
import torch

import pydsa
from pydsa import _fill_records, sglang as S
from pydsa._abi import DEFAULT_PDL_FLAG

R2T = torch.zeros(4, 8, dtype=torch.int32)


def _demo(*args, tmp=None):
    return subprocess.run([sys.executable, "-m", "pydsa", "demo", "--steps", "3", "--requests", "3", *args],
                          capture_output=True, text=True)


@pytest.mark.parametrize("flag, says", [(["--device", "meta"], "--device meta"), (["--seed", "-1"], "--seed"),
                                        (["--json", "/no/such/folder/x.json"], "--json /no/such/folder/x.json"),
                                        (["--steps", "0"], "--steps")])
def test_odd_demo_flags_are_one_line_errors_before_the_run(flag, says):
    r = _demo(*flag)
    assert r.returncode == 2 and "Traceback" not in r.stderr and says in r.stderr.strip().splitlines()[-1]
    assert "PASS" not in r.stdout


def test_demo_json_is_strict(tmp_path):
    out = tmp_path / "demo.json"
    r = _demo("--json", str(out), "--device", "cpu")
    assert r.returncode == 0, r.stdout + r.stderr
    text = out.read_text()
    assert "NaN" not in text and "Infinity" not in text
    summary = json.loads(text, parse_constant=lambda c: pytest.fail(f"non-strict JSON constant {c}"))
    assert summary["ok"] is True


def test_metadata_copy_refuses_an_unknown_destination_key():
    d = {k: torch.zeros(8, dtype=torch.int32) for k in ("cache_seqlens", "cu_seqlens_k", "dsa_cache_seqlens",
                                                         "dsa_cu_seqlens_k")}
    d["page_table_1"] = torch.zeros(4, 8, dtype=torch.int32)
    d["num_splits"] = torch.zeros(8, dtype=torch.int32)  # the key is flashmla_num_splits
    with pytest.raises(ValueError, match=r"destinations\[0\]: unknown keys \['num_splits'\]"):
        pydsa.MetadataCopy([d])


@pytest.mark.parametrize("page_size", [3, 0, 2048, 2.0, True])
def test_kv_cache_checks_its_page_size_when_made(page_size):
    with pytest.raises(ValueError, match="page_size must be a power of two"):
        pydsa.KVCache(torch.zeros(1728 * 4, dtype=torch.uint8), torch.ones(512), torch.zeros(4, 64),
                      page_size=page_size)


def test_kv_cache_checks_eps_when_made():
    with pytest.raises(ValueError, match="eps must be a finite number"):
        pydsa.KVCache(torch.zeros(1728 * 4, dtype=torch.uint8), torch.ones(512), torch.zeros(4, 64), page_size=2,
                      eps=-1.0)


def test_sglang_decode_plan_names_what_was_passed():
    with pytest.raises(RuntimeError, match=r"seq_lens must be a torch.Tensor \(got numpy.ndarray\)"):
        S.CompressorDecodePlan.generate_online(np.arange(4), torch.arange(4), R2T)
    with pytest.raises(RuntimeError, match="one length .got 4 and 3"):
        S.CompressorDecodePlan.generate_online(torch.arange(4), torch.arange(3), R2T)
    with pytest.raises(RuntimeError, match=r"seq_lens must be a contiguous 1-D int64 tensor \(got int32 \[4\]"):
        S.CompressorDecodePlan.generate_online(torch.arange(4, dtype=torch.int32), torch.arange(4), R2T)


@pytest.mark.parametrize("bad", [-1, 2**31, 2**32 + 5])
def test_sglang_decode_plan_refuses_a_seq_len_its_record_would_wrap(bad):
    with pytest.raises(RuntimeError, match=r"seq_lens must lie in 0..2\^31-1"):
        S.CompressorDecodePlan.generate_online(torch.tensor([5, bad, 7]), torch.arange(3), R2T)


def test_the_library_pads_and_counts_a_seq_len_its_record_would_wrap():
    """Device tensors are not read on the host: the plan kernel writes a padding record and counts it
    (the same code runs on the host backend, exercised here through the filler)."""
    seq = torch.tensor([5, -1, 2**33, 128])
    plan = torch.full((4, 16), 0xAB, dtype=torch.uint8)
    pydsa.error_count("cpu")
    pydsa.reset_error_count("cpu")
    assert _fill_records.decode_records(seq, torch.arange(4), state_slot_offset=0, plan_d=plan,
                                        flags=DEFAULT_PDL_FLAG) == 0
    assert plan.view(torch.int32)[:, 0].tolist() == [5, 0, 0, 128]
    assert pydsa.error_count("cpu") == 2


def test_sglang_prefill_plan_names_a_length_mismatch_as_one():
    with pytest.raises(RuntimeError, match="req_pool_indices has 3 entries but seq_lens has 2"):
        S.CompressorPrefillPlan.generate_online(torch.tensor([300, 200]), torch.tensor([100, 50]), torch.arange(3),
                                                R2T, 150)
    with pytest.raises(ValueError, match="extend_lens has 3 entries but seq_lens has 2"):
        S.CompressorPrefillPlan.generate_online(torch.tensor([300, 200]), torch.tensor([100, 50, 7]), torch.arange(2),
                                                R2T, 157)


def _decode_plan():
    return S.CompressorDecodePlan.generate_online(torch.tensor([5, 128, 7]), torch.arange(3), R2T)


@pytest.mark.parametrize("which, value, says", [
    ("ape", torch.randn(128, 256), r"ape must be \[128, 512\] \(got float32 \[128, 256\]"),
    ("kv_score_input", torch.randn(3, 1000), r"kv_score_input must have shape \[3, 1024\] \(got \[3, 1000\]\)"),
    ("kv_score_input", torch.randn(3, 1024).double(), "kv_score_input must have dtype torch.float32"),
    ("kv_score_input", np.zeros((3, 1024), np.float32), r"kv_score_input must be a torch.Tensor \(got numpy.ndarray\)"),
    ("kv_score_buffer", torch.zeros(4, 1000), r"kv_score_buffer must be \[num_slots, 1536\].*\[4, 1000\]"),
    ("out", torch.zeros(2, 512), r"out must have shape \[3, 512\]"),
])
def test_compress_forward_errors_are_in_sglang_s_words(which, value, says):
    args = dict(kv_score_buffer=torch.zeros(4, 1536), kv_score_input=torch.randn(3, 1024), ape=torch.randn(128, 512))
    kwargs = {}
    if which == "out":
        kwargs["out"] = value
    else:
        args[which] = value
    with pytest.raises((TypeError, ValueError), match=says):
        S.compress_forward(*args.values(), _decode_plan(), head_dim=512, compress_ratio=128, is_online=True, **kwargs)


def test_compress_norm_rope_store_errors_are_in_sglang_s_words():
    plan = _decode_plan()
    kv = torch.randn(3, 512)
    freq = torch.polar(torch.ones(300, 32), torch.zeros(300, 32))
    with pytest.raises(TypeError, match="out_loc must have dtype torch.int64"):
        S.compress_norm_rope_store(kv, plan, norm_weight=torch.ones(512), norm_eps=1e-6, freq_cis=freq,
                                   out_loc=torch.arange(3, dtype=torch.int32),
                                   kvcache=torch.zeros(3, 1728, dtype=torch.uint8), page_size=2)
    with pytest.raises(ValueError, match="kvcache holds 1000 bytes; .* whole 1728-byte pages"):
        S.compress_norm_rope_store(kv, plan, norm_weight=torch.ones(512), norm_eps=1e-6, freq_cis=freq,
                                   out_loc=torch.arange(3), kvcache=torch.zeros(1000, dtype=torch.uint8), page_size=2)
