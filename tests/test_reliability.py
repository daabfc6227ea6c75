"""Reliability: guard regions around every buffer, fuzzed invalid input (Python API and C entry
points), thread safety, device placement, and library loading failures."""
import contextlib
import ctypes
import ctypes.util
import subprocess
import sys
import textwrap
import threading

import numpy as np
import pytest
import torch
from hypothesis import given, settings, strategies as st

import c_structs
import pydsa
import pyplan
from conftest import DEVICES, examples, HAS_GPU
from pydsa import _abi

GUARD = 4096  # elements of guard on each side of a buffer
PATTERN_F = 12345.678
PATTERN_I = -424242


class Guarded:
    """Tensors carved out of one larger allocation with a known pattern on both sides."""

    def __init__(self, device):
        self.device = device
        self.blocks = []

    def tensor(self, shape, dtype, fill=None, gen=None):
        n = int(np.prod(shape))
        pattern = PATTERN_I if dtype == torch.int32 else PATTERN_F
        block = torch.full((n + 2 * GUARD,), pattern, dtype=dtype, device=self.device)
        view = block[GUARD:GUARD + n].view(shape)
        if fill is not None:
            view.copy_(fill)
        self.blocks.append((block, n, pattern))
        return view

    def intact(self) -> bool:
        return all(bool((b[:GUARD] == p).all()) and bool((b[GUARD + n:] == p).all()) for b, n, p in self.blocks)


# ---------------------------------------------------------------------------------------------
# Guard regions: valid and invalid input alike write nothing outside the documented outputs.


@st.composite
def c128_cases(draw):
    d = draw(st.sampled_from([64, 128, 192]))
    b = draw(st.integers(1, 6))
    slots = draw(st.integers(1, 8))
    indices = draw(st.lists(st.one_of(st.integers(0, slots - 1), st.integers(-5, slots + 5),
                                      st.sampled_from([2**31 - 1, -2**31])), min_size=b, max_size=b))
    seq_lens = draw(st.lists(st.integers(-3, 1000), min_size=b, max_size=b))
    return (d, slots, indices, seq_lens, draw(st.integers(0, 2**31)), draw(st.sampled_from([torch.float32, torch.bfloat16])),
            draw(st.booleans()))


def _c128_guarded(device, case):
    d, slots, indices, seq_lens, seed, state_dtype, compact = case
    g = Guarded(device)
    gen = torch.Generator().manual_seed(seed)
    b = len(indices)
    state = g.tensor((slots, 1, 3 * d), state_dtype, torch.rand(slots, 1, 3 * d, generator=gen) + 1)
    kv = g.tensor((b, 2 * d), torch.float32, torch.randn(b, 2 * d, generator=gen))
    out = g.tensor((b, d), torch.float32)
    ape = g.tensor((128, d), torch.float32, torch.randn(128, d, generator=gen))
    idx = g.tensor((b,), torch.int32, torch.tensor(indices, dtype=torch.int32))
    seq = g.tensor((b,), torch.int32, torch.tensor(seq_lens, dtype=torch.int32))
    counter = g.tensor((1,), torch.int32, torch.zeros(1, dtype=torch.int32))
    pydsa.c128_decode(state, kv, out, ape, idx, seq, error_count=counter)
    bad = sum(1 for i, s in zip(indices, seq_lens) if s > 0 and i >= slots)  # negative: not held here, uncounted
    assert int(counter.item()) == bad
    # Prefill with a plan whose records are partly corrupted, and out-of-range slots.
    n = max(1, sum(max(s, 1) for s in seq_lens[:2]) % 700 + 1)
    kv2 = g.tensor((n, 2 * d), torch.float32, torch.randn(n, 2 * d, generator=gen))
    compress, write = pyplan.plan_prefill([n + 5], [n])
    out2 = g.tensor((len(compress) if compact else n, d), torch.float32)
    rng = np.random.default_rng(seed)
    for recs in (compress, write):
        for r in recs:
            if rng.random() < 0.3:
                r[rng.choice(["ragged_id", "batch_id", "position", "window_len"])] = rng.integers(0, 2**32, dtype=np.uint64)
    try:  # a host plan's record that no longer fits the call is an error; slots stay data
        pydsa.c128_prefill(state, kv2, out2, ape, idx[:1], (compress, write), load_indices=idx[-1:],
                           error_count=counter, compact=compact)
    except pydsa.DsaError as exc:
        assert "does not fit this call" in str(exc)
    if device.type == "cuda":
        torch.cuda.synchronize()
    assert g.intact(), "a write landed outside the buffers"


@pytest.mark.parametrize("device_name", DEVICES)
@settings(max_examples=examples(60))
@given(c128_cases())
def test_c128_never_writes_outside_its_buffers(device_name, case):
    _c128_guarded(torch.device(device_name), case)


def _metadata_guarded(device, bs, width, extra, k):
    g = Guarded(device)
    i32 = torch.int32
    src = dict(cache_seqlens=g.tensor((bs,), i32, torch.arange(bs, dtype=i32)),
               cu_seqlens_k=g.tensor((bs + 1,), i32, torch.arange(bs + 1, dtype=i32)),
               page_indices=g.tensor((bs, width), i32, torch.arange(bs * width, dtype=i32).view(bs, width)),
               dsa_cache_seqlens=g.tensor((bs,), i32, torch.arange(bs, dtype=i32)),
               dsa_cu_seqlens_k=g.tensor((bs + 1,), i32, torch.arange(bs + 1, dtype=i32)))
    dsts = [dict(cache_seqlens=g.tensor((bs + extra,), i32, torch.zeros(bs + extra, dtype=i32)),
                 cu_seqlens_k=g.tensor((bs + 1 + extra,), i32, torch.zeros(bs + 1 + extra, dtype=i32)),
                 page_table_1=g.tensor((bs + extra, width + extra), i32, torch.zeros(bs + extra, width + extra, dtype=i32)),
                 dsa_cache_seqlens=g.tensor((bs + extra,), i32, torch.zeros(bs + extra, dtype=i32)),
                 dsa_cu_seqlens_k=g.tensor((bs + 1 + extra,), i32, torch.zeros(bs + 1 + extra, dtype=i32)))
            for _ in range(k)]
    pydsa.MetadataCopy(dsts)(**src)
    if device.type == "cuda":
        torch.cuda.synchronize()
    assert g.intact()


@pytest.mark.parametrize("bs,width,extra,k", [(1, 1, 0, 1), (17, 97, 0, 3), (129, 4097, 1, 2), (256, 4096, 0, 8)])
def test_metadata_copy_never_writes_outside_its_buffers(device, bs, width, extra, k):
    _metadata_guarded(device, bs, width, extra, k)


# ---------------------------------------------------------------------------------------------
# Fuzzed invalid arguments: a clear exception or status, never a crash.

bad_values = st.sampled_from([None, 0, 1.5, "x", np.zeros(3), torch.zeros(2, 2, dtype=torch.float64),
                              torch.zeros(3, dtype=torch.int64), torch.zeros(0), torch.zeros(5, 5).t()])


@settings(max_examples=examples(80))
@given(st.sampled_from(["state", "kv_score", "out", "ape", "indices", "seq_lens"]), bad_values)
def test_decode_rejects_any_bad_argument(name, value):
    d = 64
    args = dict(state=torch.zeros(2, 1, 3 * d), kv_score=torch.zeros(3, 2 * d), out=torch.zeros(3, d),
                ape=torch.zeros(128, d), indices=torch.zeros(3, dtype=torch.int32), seq_lens=torch.ones(3, dtype=torch.int32))
    args[name] = value
    with pytest.raises((TypeError, ValueError)) as e:
        pydsa.c128_decode(**args)
    assert name in str(e.value) or "head dim" in str(e.value)


@settings(max_examples=examples(80))
@given(st.sampled_from(["cache_seqlens", "cu_seqlens_k", "page_indices", "dsa_cache_seqlens", "dsa_cu_seqlens_k"]), bad_values)
def test_metadata_copy_rejects_any_bad_source(name, value):
    i32 = torch.int32
    dst = dict(cache_seqlens=torch.zeros(4, dtype=i32), cu_seqlens_k=torch.zeros(5, dtype=i32),
               page_table_1=torch.zeros(4, 8, dtype=i32), dsa_cache_seqlens=torch.zeros(4, dtype=i32),
               dsa_cu_seqlens_k=torch.zeros(5, dtype=i32))
    src = dict(cache_seqlens=torch.zeros(3, dtype=i32), cu_seqlens_k=torch.zeros(4, dtype=i32),
               page_indices=torch.zeros(3, 8, dtype=i32), dsa_cache_seqlens=torch.zeros(3, dtype=i32),
               dsa_cu_seqlens_k=torch.zeros(4, dtype=i32))
    before = {k: v.clone() for k, v in dst.items()}
    src[name] = value
    with pytest.raises((TypeError, ValueError)) as e:
        pydsa.MetadataCopy(dst)(**src)
    assert name in str(e.value) or "cu_seqlens_k" in str(e.value)
    assert all(torch.equal(dst[k], before[k]) for k in dst)


sizes = st.one_of(st.integers(-2**63, -1), st.just(0), st.integers(2**31, 2**62))


@settings(max_examples=examples(150))
@given(st.sampled_from(["bs", "page_rows", "page_width", "expanded", "real_cols", "metadata_size"]), sizes,
       st.integers(-3, 12), st.integers(-2, 5))
def test_metadata_copy_c_entry_refuses_bad_sizes(field, value, k, mode):
    """Negative or oversized sizes, bad K or mode: a status and a message, nothing touched."""
    buf = (ctypes.c_int32 * 64)(*([7] * 64))
    dst = (c_structs.MetadataDestination * 12)()
    for d in dst:
        for name in ("cache_seqlens", "cu_seqlens_k", "page_table", "dsa_cache_seqlens", "dsa_cu_seqlens_k"):
            setattr(d, name, ctypes.addressof(buf))
        d.cache_seqlens_len = d.cu_seqlens_k_len = d.dsa_cache_seqlens_len = d.dsa_cu_seqlens_k_len = 8
        d.page_table_rows = d.page_table_cols = d.page_table_stride = 4
    p = c_structs.new(c_structs.MetadataCopyParams)
    p.device, p.mode, p.num_destinations = -1, mode, k
    p.bs, p.page_rows, p.page_width = 2, 2, 2
    for name in ("cache_seqlens", "cu_seqlens_k", "page_indices", "dsa_cache_seqlens", "dsa_cu_seqlens_k"):
        setattr(p.src, name, ctypes.addressof(buf))
    p.destinations = ctypes.addressof(dst)
    setattr(p, field, value)
    status = _abi.lib.dsa_metadata_copy(ctypes.byref(p), None)
    # Sizes of absent optional groups are not used (no real page table, no FlashMLA here), nor is
    # `expanded` in DECODE; any other non-zero value here is negative or beyond every capacity.
    ignored = field in ("real_cols", "metadata_size") or (field == "expanded" and mode == 0)
    valid_call = 1 <= k <= 8 and 0 <= mode <= 2 and (value == 0 or ignored)
    if p.bs == 0:
        assert status == 0
    elif not valid_call:
        assert status in (1, 3) and _abi.lib.dsa_last_error()
    assert list(buf)[:8] == [7] * 8 or status == 0


@settings(max_examples=examples(100))
@given(st.sampled_from(["head_dim", "num_slots", "batch_size"]), st.one_of(st.integers(-2**31, 0), st.integers(1, 63)))
def test_c128_c_entries_refuse_bad_sizes(field, value):
    state = (ctypes.c_float * (3 * 64))()
    p = c_structs.new(c_structs.C128DecodeParams)
    p.device, p.head_dim, p.num_slots, p.batch_size = -1, 64, 1, 1
    for name in ("state", "kv_score", "out", "ape", "indices", "seq_lens"):
        setattr(p, name, ctypes.addressof(state))
    if field == "batch_size" and value >= 0:
        return
    if field == "num_slots" and value > 0:
        return
    setattr(p, field, value)
    assert _abi.lib.dsa_c128_decode(ctypes.byref(p), None) == 1
    assert field.split("_")[0] in _abi.lib.dsa_last_error().decode()


def test_c_entries_refuse_null_pointers():
    p = c_structs.new(c_structs.C128DecodeParams)
    p.device, p.head_dim, p.num_slots, p.batch_size = -1, 64, 1, 1
    assert _abi.lib.dsa_c128_decode(ctypes.byref(p), None) == 1
    assert "non-null" in _abi.lib.dsa_last_error().decode()
    q = c_structs.new(c_structs.C128PrefillParams)
    q.device, q.head_dim, q.num_slots, q.batch_size, q.num_tokens, q.compress_capacity = -1, 64, 1, 1, 1, 3
    assert _abi.lib.dsa_c128_prefill(ctypes.byref(q), None) == 1
    assert "null" in _abi.lib.dsa_last_error().decode()


def test_device_call_without_a_gpu_is_a_clear_error():
    if HAS_GPU:
        pytest.skip("a GPU is present")
    state = (ctypes.c_float * (3 * 64))()
    p = c_structs.new(c_structs.C128DecodeParams)
    p.device, p.head_dim, p.num_slots, p.batch_size = 0, 64, 1, 1
    for name in ("state", "kv_score", "out", "ape", "indices", "seq_lens"):
        setattr(p, name, ctypes.addressof(state))
    assert _abi.lib.dsa_c128_decode(ctypes.byref(p), None) == 5
    assert "no CUDA device" in _abi.lib.dsa_last_error().decode()


# ---------------------------------------------------------------------------------------------
# Threads


def test_errors_are_per_thread():
    """Two threads failing for different reasons each read their own message."""
    results = {}
    barrier = threading.Barrier(2)

    def fail_decode():
        p = c_structs.new(c_structs.C128DecodeParams)
        p.batch_size = -7
        barrier.wait()
        for _ in range(200):
            _abi.lib.dsa_c128_decode(ctypes.byref(p), None)
            results.setdefault("decode", set()).add(_abi.lib.dsa_last_error().decode())

    def fail_plan():
        p = c_structs.new(c_structs.PlanParams)
        p.batch_size = -3
        barrier.wait()
        for _ in range(200):
            _abi.lib.dsa_c128_plan_prefill(ctypes.byref(p))
            results.setdefault("plan", set()).add(_abi.lib.dsa_last_error().decode())

    threads = [threading.Thread(target=fail_decode), threading.Thread(target=fail_plan)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results["decode"] == {"dsa_c128_decode: batch_size is -7; expected >= 0"}
    assert results["plan"] == {"dsa_c128_plan_prefill: batch_size is -3; expected >= 0"}


def _threaded_ops(device):
    """Several threads run every op at once (each on its own stream on the GPU)."""
    from test_c128_prefill import run_schedule
    errors = []

    def work(seed):
        try:
            stream = torch.cuda.Stream() if device.type == "cuda" else None
            ctx = torch.cuda.stream(stream) if stream is not None else contextlib.nullcontext()
            with ctx:
                for _ in range(5):
                    d = 128
                    sched = (d, [300, 129, 50], [("prefill", {0: 200, 1: 129, 2: 50}, {1}, False), ("decode", [0], 0),
                                                 ("prefill", {0: 99}, set(), True)], seed, torch.float32)
                    run_schedule(device, sched)
                    _metadata_guarded(device, 33, 129, 1, 2)
            if stream is not None:
                stream.synchronize()
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append(repr(exc))

    threads = [threading.Thread(target=work, args=(s,)) for s in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors


def test_ops_from_several_threads_give_correct_results(device):
    _threaded_ops(device)


def test_library_can_be_imported_from_several_threads_at_once():
    code = textwrap.dedent("""
        import threading, importlib
        errs = []
        def imp():
            try:
                import pydsa, pyplan
                pyplan.plan_prefill([300], [200])
                pydsa.kv_page_bytes(512, 64)
            except Exception as e:
                errs.append(repr(e))
        ts = [threading.Thread(target=imp) for _ in range(8)]
        [t.start() for t in ts]; [t.join() for t in ts]
        print("ERRS", errs)
    """)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert "ERRS []" in r.stdout, r.stdout + r.stderr


# ---------------------------------------------------------------------------------------------
# Device placement


two_gpus = pytest.mark.skipif(not HAS_GPU or torch.cuda.device_count() < 2, reason="needs two GPUs")


@two_gpus
@pytest.mark.gpu
def test_ops_run_on_the_tensors_device_not_the_current_one():
    """A whole schedule and a K = 3 metadata copy on cuda:1 while cuda:0 is current."""
    from test_c128_prefill import run_schedule
    torch.cuda.set_device(0)
    dev1 = torch.device("cuda", 1)
    sched = (128, [201, 129], [("prefill", {0: 200, 1: 129}, {1}, False), ("decode", [0], 1)], 3, torch.float32)
    server = run_schedule(dev1, sched)
    assert server.emitted == 2
    _metadata_guarded(dev1, 17, 300, 1, 3)
    assert torch.cuda.current_device() == 0


def _on_cuda1_side_stream(call):
    """Runs call(stream handle) with cuda:0 current and a non-default stream of cuda:1 passed in,
    then checks the current device did not move."""
    torch.cuda.set_device(0)
    stream = torch.cuda.Stream(device=1)
    call(stream.cuda_stream)
    assert torch.cuda.current_device() == 0
    stream.synchronize()


@two_gpus
@pytest.mark.gpu
@pytest.mark.parametrize("family", ["decode", "prefill_device_plan", "prefill_host_plan", "metadata_k3"])
def test_each_op_family_on_the_second_gpu_from_a_side_stream(family):
    """Decode, prefill with a DevicePlan (two passes) and with a small host plan (one cooperative
    launch, sized for cuda:1) and a K = 3 metadata copy on cuda:1, on a side stream of cuda:1,
    while cuda:0 is current: results equal the host backend's, the current device is unchanged
    after every call."""
    gen = torch.Generator().manual_seed(5)
    d = 128
    dev1 = torch.device("cuda", 1)
    ape = torch.randn(128, d, generator=gen)
    state0 = torch.rand(6, 1, 3 * d, generator=gen) + 1
    i32 = dict(dtype=torch.int32)
    if family == "decode":
        kv = torch.randn(4, 2 * d, generator=gen)
        idx, seq = torch.tensor([5, 0, 2, 3], **i32), torch.tensor([7, 128, 1, 0], **i32)
        got_state, got_out = state0.to(dev1), torch.full((4, d), float("nan"), device=dev1)
        _on_cuda1_side_stream(lambda s: pydsa.c128_decode(got_state, kv.to(dev1), got_out, ape.to(dev1), idx.to(dev1),
                                                          seq.to(dev1), stream=s))
        want_state, want_out = state0.clone(), torch.full((4, d), float("nan"))
        pydsa.c128_decode(want_state, kv, want_out, ape, idx, seq)
        pairs = [(got_state, want_state), (got_out, want_out)]
    elif family.startswith("prefill"):
        seq, ext = np.array([300, 40, 129]), np.array([250, 40, 129])
        n = int(ext.sum())
        kv = torch.randn(512, 2 * d, generator=gen)
        idx = torch.tensor([1, 4, 0], **i32)
        if family == "prefill_device_plan":
            plan = pydsa.DevicePlan(512, 3, device=dev1)
        got_state, got_out = state0.to(dev1), torch.full((512, d), float("nan"), device=dev1)

        def call(s):
            if family == "prefill_device_plan":
                plan.plan(seq, ext, num_tokens=512, stream=s)
                pydsa.c128_prefill(got_state, kv.to(dev1), got_out, ape.to(dev1), idx.to(dev1), plan, stream=s)
            else:
                pydsa.c128_prefill(got_state, kv[:n].to(dev1), got_out[:n], ape.to(dev1), idx.to(dev1),
                                   pyplan.plan_prefill(seq, ext), stream=s)
        _on_cuda1_side_stream(call)
        want_state, want_out = state0.clone(), torch.full((n, d), float("nan"))
        pydsa.c128_prefill(want_state, kv[:n], want_out, ape, idx, pyplan.plan_prefill(seq, ext))
        assert torch.isnan(got_out[n:].cpu()).all()
        pairs = [(got_state, want_state), (got_out[:n], want_out)]
    else:
        src = dict(cache_seqlens=torch.randint(0, 99, (5,), **i32), cu_seqlens_k=torch.randint(0, 99, (6,), **i32),
                   page_indices=torch.randint(0, 99, (5, 70), **i32), dsa_cache_seqlens=torch.randint(0, 99, (5,), **i32),
                   dsa_cu_seqlens_k=torch.randint(0, 99, (6,), **i32))
        dsts = [dict(cache_seqlens=torch.full((8,), -1, **i32), cu_seqlens_k=torch.full((9,), -1, **i32),
                     page_table_1=torch.full((6, 80), -1, **i32), dsa_cache_seqlens=torch.full((8,), -1, **i32),
                     dsa_cu_seqlens_k=torch.full((9,), -1, **i32)) for _ in range(3)]
        got = [{k: v.to(dev1) for k, v in dst.items()} for dst in dsts]
        copy = pydsa.MetadataCopy(got)
        _on_cuda1_side_stream(lambda s: copy(**{k: v.to(dev1) for k, v in src.items()}, stream=s))
        pydsa.metadata_copy(src, dsts)
        pairs = [(g[k], w[k]) for g, w in zip(got, dsts) for k in w]
    for got, want in pairs:
        got = got.cpu()
        assert torch.equal(torch.isnan(got), torch.isnan(want)) if got.is_floating_point() else True
        torch.testing.assert_close(got.nan_to_num(), want.nan_to_num(), rtol=2e-6, atol=2e-6)


@two_gpus
@pytest.mark.gpu
def test_tensors_on_two_devices_are_refused():
    d = 64
    args = dict(state=torch.zeros(2, 1, 3 * d, device="cuda:0"), kv_score=torch.zeros(3, 2 * d, device="cuda:1"),
                out=torch.zeros(3, d, device="cuda:0"), ape=torch.zeros(128, d, device="cuda:0"),
                indices=torch.zeros(3, dtype=torch.int32, device="cuda:0"),
                seq_lens=torch.ones(3, dtype=torch.int32, device="cuda:0"))
    with pytest.raises(ValueError, match="kv_score is on cuda:1 but the other tensors are on cuda:0"):
        pydsa.c128_decode(**args)


# ---------------------------------------------------------------------------------------------
# Library loading


def _import_with(env_lib):
    code = "import pydsa"
    env = {"PYDSA_LIBRARY": env_lib, "PATH": "/usr/bin:/bin"}
    import os
    env.update({k: v for k, v in os.environ.items() if k.startswith(("PYTHON", "VIRTUAL_ENV", "LD_"))})
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)


def test_missing_library_is_one_clear_import_error(tmp_path):
    r = _import_with(str(tmp_path / "nope.so"))
    assert r.returncode != 0 and "ImportError" in r.stderr and "was not found" in r.stderr and "pip install" in r.stderr


def test_foreign_library_is_refused(tmp_path):
    r = _import_with(ctypes.util.find_library("m") and "/lib/x86_64-linux-gnu/libm.so.6")
    assert r.returncode != 0 and "not a libdsa_kernels build" in r.stderr


def test_abi_mismatched_library_is_refused(tmp_path):
    src = tmp_path / "fake.c"
    src.write_text("int dsa_abi_version(void) { return 999; }\nunsigned long dsa_struct_size(int id) { return 0; }\n")
    lib = tmp_path / "libfake.so"
    if subprocess.run(["gcc", "-shared", "-fPIC", str(src), "-o", str(lib)]).returncode != 0:
        pytest.skip("needs gcc")
    r = _import_with(str(lib))
    assert r.returncode != 0 and "ABI version 999" in r.stderr and "stale build" in r.stderr


# ---------------------------------------------------------------------------------------------
# Arrays of other frameworks at the front door


def test_commit_takes_numpy_arrays_like_tensors():
    seq, accepted = np.array([5, 130], np.int32), np.array([1, 0], np.int32)
    load = np.full(2, -9, np.int32)
    pydsa.c128_commit(seq, accepted, np.zeros(2, np.int32), np.array([2, 4], np.int32), num_drafts=2,
                      load_indices=load, num_slots=8)
    assert load.tolist() == [3, 4]  # entry 1 of request 0's bank; request 1 accepted nothing: its entry 0
    states = [np.random.default_rng(0).random((8, 1, 192), dtype=np.float32)]
    before = states[0].copy()
    pydsa.c128_commit(seq, accepted, np.zeros(2, np.int32), np.array([2, 4], np.int32), num_drafts=2, states=states,
                      num_slots=8)
    assert np.array_equal(states[0][0], before[3]) and np.array_equal(states[0][1:], before[1:])
    with pytest.raises(TypeError, match="seq_lens must be a torch.Tensor or an array with __dlpack__"):
        pydsa.c128_commit([5, 130], accepted, np.zeros(2, np.int32), np.array([2, 4], np.int32), num_drafts=2,
                          load_indices=load, num_slots=8)


def test_a_read_only_array_is_never_written_into():
    out = np.zeros((2, 64), np.float32)
    out.flags.writeable = False
    with pytest.raises(ValueError, match="out is a read-only array"):
        pydsa.c128_decode(torch.zeros(4, 1, 192), torch.zeros(2, 128), out, torch.zeros(128, 64),
                          torch.zeros(2, dtype=torch.int32), torch.full((2,), 128, dtype=torch.int32))
    assert not out.any()
