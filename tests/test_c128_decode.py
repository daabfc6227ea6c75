"""The c128 decode (docs/spec.md, decode): its semantics on both backends, records read in place, bad arguments named, the C ABI's decode checks, other frameworks' arrays."""

import numpy as np
import pytest
import torch

import c_structs
import pydsa
from pydsa import _abi
from conftest import DEVICES, gpu
from reference import CHUNK, online_step_fp32, rel_err
from c128_cases import POISON, _valid, ape_for, random_state


# ---------------------------------------------------------------------------------------------
# Decode step semantics


@pytest.mark.parametrize("d", [128, 256, 512, 192])
def test_decode_step_matches_spec_update_at_chunk_edges(device, d):
    """Positions 0, 1, 63, 126, 127, 128, 129: fresh start at 0, the per-token update elsewhere, chunk
    close at 127 writes out and leaves the slot alone; untouched out rows keep their poison."""
    gen = torch.Generator().manual_seed(d)
    positions = [0, 1, 63, 126, 127, 128, 129, 255]
    b = len(positions)
    slots = torch.randperm(b + 3, generator=gen)[:b].to(torch.int32)
    state0 = random_state(b + 3, d, gen)
    kv_score = torch.randn(b, 2 * d, generator=gen)
    ape = ape_for(d)
    seq_lens = torch.tensor([p + 1 for p in positions], dtype=torch.int32)
    state = state0.clone().to(device)
    out = torch.full((b, d), POISON, device=device)
    pydsa.c128_decode(state, kv_score.to(device), out, ape.to(device), slots.to(device), seq_lens.to(device))
    state, out = state.cpu(), out.cpu()
    for i, p in enumerate(positions):
        c = p % CHUNK
        row = state0[slots[i], 0].numpy()
        t = (kv_score[i, d:] + ape[c]).numpy()
        v = kv_score[i, :d].numpy()
        if c == 0:
            m, s, k = t, np.ones(d, np.float32), v
        else:
            m, s, k = online_step_fp32(row[:d], row[d:2 * d], row[2 * d:], t, v)
        if c == CHUNK - 1:
            assert rel_err(out[i].numpy(), k) < 1e-6
            assert torch.equal(state[slots[i]], state0[slots[i]]), "a chunk close must not write the slot"
        else:
            assert torch.isnan(out[i]).all(), "out rows of requests that do not close a chunk stay untouched"
            got = state[slots[i], 0].numpy()
            assert rel_err(got[:d], m) < 1e-6 and rel_err(got[d:2 * d], s) < 1e-6 and rel_err(got[2 * d:], k) < 1e-6
    untouched = torch.ones(b + 3, dtype=torch.bool)
    untouched[slots.long()] = False
    assert torch.equal(state[untouched], state0[untouched])


def test_decode_padding_rows_and_empty_batch(device):
    """seq_len <= 0 is padding: even a garbage slot index is neither read nor counted; B = 0 is a
    no-op."""
    d = 128
    gen = torch.Generator().manual_seed(3)
    state0 = random_state(4, d, gen).to(device)
    state = state0.clone()
    out = torch.full((3, d), POISON, device=device)
    pydsa.reset_error_count(device)
    pydsa.c128_decode(state, torch.randn(3, 2 * d, device=device), out, ape_for(d).to(device),
                      torch.tensor([1 << 30, -7, 2], dtype=torch.int32, device=device),
                      torch.tensor([0, -5, 128], dtype=torch.int32, device=device))
    assert pydsa.error_count(device) == 0
    assert torch.equal(state[:2], state0[:2]) and torch.equal(state[3], state0[3])
    assert torch.isnan(out[:2]).all() and not torch.isnan(out[2]).any()
    empty = torch.zeros(0, dtype=torch.int32, device=device)
    pydsa.c128_decode(state, torch.zeros(0, 2 * d, device=device), torch.zeros(0, d, device=device),
                      ape_for(d).to(device), empty, empty)


def test_decode_out_of_range_slot_is_skipped_and_counted_a_negative_one_skipped_silently(device):
    """As in every op (docs/spec.md, conventions): a negative slot is not held on this GPU."""
    d = 128
    state0 = random_state(4, d, torch.Generator().manual_seed(5)).to(device)
    state = state0.clone()
    out = torch.full((3, d), POISON, device=device)
    counter = torch.zeros(1, dtype=torch.int32, device=device)
    pydsa.c128_decode(state, torch.randn(3, 2 * d, device=device), out, ape_for(d).to(device),
                      torch.tensor([4, -1, 1 << 31 - 1], dtype=torch.int32, device=device),
                      torch.tensor([5, 128, 1], dtype=torch.int32, device=device), error_count=counter)
    assert int(counter.item()) == 2  # slots 4 (past the 4 slots) and 2^30, not -1
    assert torch.equal(state, state0) and torch.isnan(out).all()


@pytest.mark.parametrize("state_dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("as_bytes", [False, True])
def test_decode_reads_per_request_records_in_place(device, state_dtype, as_bytes):
    """seq_lens None: `indices` holds {seq_len, slot, load slot, unused} per request (sglang 0.5.23's
    decode records). The same call as three arrays, bit for bit: fresh, mid-chunk and closing rows,
    a load slot other than the slot, padding, a load slot not held here, out-of-range slots."""
    d, b = 512, 9
    gen = torch.Generator().manual_seed(11)
    state0 = random_state(12, d, gen).to(state_dtype).to(device)
    kv = torch.randn(b, 2 * d, generator=gen).to(device)
    ape = ape_for(d).to(device)
    seq = torch.tensor([1, 77, 128, 300, 0, 5, 129, 256, 40], dtype=torch.int32)
    slot = torch.tensor([0, 1, 2, 3, 1 << 30, 5, 6, 7, 20], dtype=torch.int32)
    load = torch.tensor([0, 9, 2, 10, 0, -1, 6, 11, 3], dtype=torch.int32)
    records = torch.stack([seq, slot, load, torch.full_like(seq, -1)], dim=1).contiguous()
    results = []
    for how in ("arrays", "records"):
        state = state0.clone()
        out = torch.full((b, d), POISON, device=device)
        counter = torch.zeros(1, dtype=torch.int32, device=device)
        if how == "arrays":
            pydsa.c128_decode(state, kv, out, ape, slot.to(device), seq.to(device), load_indices=load.to(device),
                              error_count=counter)
        else:
            r = records.view(torch.uint8) if as_bytes else records
            pydsa.c128_decode(state, kv, out, ape, r.to(device), None, error_count=counter)
        results.append((state.cpu(), out.cpu(), int(counter.item())))
    (s0, o0, e0), (s1, o1, e1) = results
    assert e0 == e1 == 1 and torch.equal(s0, s1) and torch.equal(o0.isnan(), o1.isnan())
    assert torch.equal(o0.nan_to_num(), o1.nan_to_num()) and not o1[2].isnan().any() and not torch.equal(s1, state0.cpu())
    with pytest.raises(ValueError, match="load_indices must be None"):
        pydsa.c128_decode(state0.clone(), kv, o1.to(device), ape, records.to(device), None, load_indices=load.to(device))
    with pytest.raises(ValueError, match=r"indices \(records"):
        pydsa.c128_decode(state0.clone(), kv, o1.to(device), ape, records[:, :3].contiguous().to(device), None)



# ---------------------------------------------------------------------------------------------
# Bad input




@pytest.mark.parametrize("name,bad,error,match", [
    ("state", lambda t: t.double(), TypeError, "state must have dtype torch.float32"),
    ("state", lambda t: t[:, :, :300], ValueError, "multiple of 64"),
    ("kv_score", lambda t: t[:, :100], ValueError, r"kv_score must have shape \[2, 256\]"),
    ("out", lambda t: t[:1], ValueError, r"out must have shape \[2, 128\]"),
    ("out", lambda t: torch.zeros(128, 2, device=t.device).t(), ValueError, "out must be contiguous"),
    ("ape", lambda t: t[:127], ValueError, r"ape must have shape \[128, 128\]"),
    ("indices", lambda t: t.long(), TypeError, "indices must have dtype torch.int32"),
    ("seq_lens", lambda t: t.tolist(), TypeError, "seq_lens must be a torch.Tensor or an array with __dlpack__"),
])
def test_decode_bad_arguments_are_named(device, name, bad, error, match):
    args = _valid(device)
    args[name] = bad(args[name])
    with pytest.raises(error, match=match):
        pydsa.c128_decode(**args)


@gpu
@pytest.mark.gpu
def test_mixed_devices_are_refused():
    args = _valid("cuda")
    args["ape"] = args["ape"].cpu()
    with pytest.raises(ValueError, match="ape is on cpu but the other tensors are on cuda"):
        pydsa.c128_decode(**args)



def test_abi_decode_records_refuse_separate_arrays():
    """DSA_FLAG_DECODE_RECORDS: the records are `indices`; a seq_lens or load_indices beside them is an error
    and nothing runs."""
    import ctypes
    d, b = 128, 2
    state = torch.zeros(4, 1, 3 * d)
    kv, out, ape = torch.randn(b, 2 * d), torch.full((b, d), POISON), torch.zeros(CHUNK, d)
    rec = torch.tensor([[128, 0, 0, -1], [128, 1, 1, -1]], dtype=torch.int32)
    for field in ("seq_lens", "load_indices"):
        p = c_structs.new(c_structs.C128DecodeParams)
        p.flags, p.device, p.head_dim, p.num_slots, p.batch_size = c_structs.CONSTANTS["DSA_FLAG_DECODE_RECORDS"], -1, d, 4, b
        p.state, p.kv_score, p.out, p.ape = state.data_ptr(), kv.data_ptr(), out.data_ptr(), ape.data_ptr()
        p.indices = rec.data_ptr()
        setattr(p, field, rec.data_ptr())
        assert _abi.lib.dsa_c128_decode(ctypes.byref(p), None) == 1  # DSA_STATUS_INVALID_ARGUMENT
        assert "seq_lens and load_indices must be null" in _abi.lib.dsa_last_error().decode()
        assert out.isnan().all()
        setattr(p, field, None)
        assert _abi.lib.dsa_c128_decode(ctypes.byref(p), None) == 0 and not out.isnan().any()
        out.fill_(POISON)


def test_abi_refuses_a_wrong_struct_size():
    import ctypes
    from pydsa import _abi
    p = c_structs.new(c_structs.C128DecodeParams)
    p.struct_size -= 8
    status = _abi.lib.dsa_c128_decode(ctypes.byref(p), None)
    assert status == 2
    assert "struct_size" in _abi.lib.dsa_last_error().decode()


@gpu
@pytest.mark.gpu
def test_gpu_decode_refuses_a_batch_beyond_int32_before_launching():
    """The decode kernel indexes requests in 32 bits: a batch_size above INT32_MAX is refused by
    the C entry point with a clear error, and nothing runs (the buffers stay as they were)."""
    import ctypes
    d = 128
    args = _valid(torch.device("cuda"), d=d)
    state0 = args["state"].clone()
    p = c_structs.new(c_structs.C128DecodeParams)
    p.device, p.head_dim, p.num_slots, p.batch_size = torch.cuda.current_device(), d, 4, 2 ** 31
    for field in ("state", "kv_score", "out", "ape", "indices", "seq_lens"):
        setattr(p, field, args[field].data_ptr())
    status = _abi.lib.dsa_c128_decode(ctypes.byref(p), torch.cuda.current_stream().cuda_stream)
    torch.cuda.synchronize()
    assert status == 1
    assert "batch_size or head_dim too large" in _abi.lib.dsa_last_error().decode()
    assert torch.equal(args["state"], state0)


def _dlpack_arrays(device):
    """A DLPack-speaking array module for `device` (numpy on the host, CuPy on the GPU), or a skip."""
    if device.type == "cpu":
        return np.asarray
    cupy = pytest.importorskip("cupy")
    return lambda t: cupy.asarray(t)


def test_dlpack_arrays_are_taken_without_copies(device):
    """Arrays of other frameworks (numpy, CuPy) work through __dlpack__: the op writes into their
    memory and the result equals the torch call's."""
    to_array = _dlpack_arrays(device)
    d = 128
    gen = torch.Generator().manual_seed(9)
    state = (torch.rand(3, 1, 3 * d, generator=gen) + 1).to(device)
    kv = torch.randn(2, 2 * d, generator=gen).to(device)
    ape = ape_for(d).to(device)
    idx = torch.tensor([2, 0], dtype=torch.int32, device=device)
    seq = torch.tensor([128, 5], dtype=torch.int32, device=device)
    want_state, want_out = state.clone(), torch.full((2, d), POISON, device=device)
    pydsa.c128_decode(want_state, kv, want_out, ape, idx, seq)
    got_state, got_out = to_array(state.clone()), to_array(torch.full((2, d), POISON, device=device))
    pydsa.c128_decode(got_state, to_array(kv), got_out, to_array(ape), to_array(idx), to_array(seq))
    assert torch.equal(torch.from_dlpack(got_state), want_state)
    assert torch.equal(torch.from_dlpack(got_out).isnan(), want_out.isnan())
    with pytest.raises(TypeError, match="indices must have dtype torch.int32"):
        pydsa.c128_decode(got_state, to_array(kv), got_out, to_array(ape), to_array(idx.long()), to_array(seq))


@pytest.mark.parametrize("device", DEVICES)
def test_a_successful_call_clears_the_thread_s_last_error(device):
    """dsa_last_error() describes the thread's last call: a refused call sets it, a successful one (either
    backend) clears it."""
    import ctypes
    args = _valid(torch.device(device))
    p = c_structs.new(c_structs.C128DecodeParams)
    p.struct_size = 1  # refused: the wrong struct size
    assert _abi.lib.dsa_c128_decode(ctypes.byref(p), None) != 0
    assert _abi.lib.dsa_last_error().decode() != ""
    pydsa.c128_decode(**args)
    assert _abi.lib.dsa_last_error().decode() == ""
