"""The one params filler (pydsa/_calls.pyx) and the checks in front of it.

For valid arguments the filler fills, through either of its readers (the DLPack exchange API and
the attribute reader for a torch without it), the same bytes, and the same bytes again from the
arguments as the checks convert them (DLPack views of other arrays). For an argument that is wrong
in any one way the filler declines (writes nothing, launches nothing) and the checks raise the error
naming it. And the one-shot calls really take the filler without the checks."""
import ctypes as C

import numpy as np
import pytest
import torch
from hypothesis import given, settings, strategies as st

import pydsa
import pyplan
from conftest import DEVICES, examples
from pydsa import _calls, c128
from pydsa._op import SIZES
from pydsa._tensors import error_counter

POISON = b"\xab"
for _dev in [-1] + list(range(torch.cuda.device_count())):
    error_counter(_dev)  # the default counters exist (the first call of a process makes them)


def _buffer(size):
    buf = C.create_string_buffer(POISON * size, size)
    return buf, C.addressof(buf)


def _fill(fill, sid, args, **extra):
    """(filled?, params bytes) of fill(address, **args, **extra) into a poisoned buffer."""
    buf, address = _buffer(SIZES[sid])
    ok = fill(address, **args, **extra)
    return ok, buf.raw


def _both_readers(fill, sid, args, **extra):
    """The params through the exchange API and through the attribute reader: they must agree."""
    first = _fill(fill, sid, args, **extra)
    _calls.read_attributes_only(True)
    try:
        second = _fill(fill, sid, args, **extra)
    finally:
        _calls.read_attributes_only(False)
    assert first == second
    return first


def test_the_compiled_path_is_on_with_a_torch_that_has_the_exchange_api():
    # torch >= 2.10 exports the DLPack C exchange API; with an older torch the attribute reader runs.
    assert _calls.available == hasattr(torch.Tensor, "__dlpack_c_exchange_api__")
    assert _calls.available, f"torch {torch.__version__} lacks __dlpack_c_exchange_api__"


# ---------------------------------------------------------------------------------------------
# Argument sets

def _decode_args(dev, d, b, slots, bf16, gen):
    state = torch.randn(slots, 1, 3 * d, generator=gen).to(dev, torch.bfloat16 if bf16 else torch.float32)
    return dict(state=state, kv_score=torch.randn(b, 2 * d, generator=gen).to(dev),
                out=torch.full((b, d), float("nan"), device=dev), ape=torch.randn(128, d, generator=gen).to(dev),
                indices=torch.arange(b, dtype=torch.int32).to(dev) % max(slots, 1),
                seq_lens=torch.randint(-2, 500, (b,), generator=gen, dtype=torch.int32).to(dev))


def _prefill_args(dev, d, extends, bf16, plan_kind, compact, load, gen):
    ext = np.array(extends, np.int64)
    seq = ext + 7
    n, b = int(ext.sum()), len(extends)
    if plan_kind == "device_plan":
        plan = pydsa.DevicePlan(max(n, 1), b, device=dev).plan(seq, ext, num_tokens=n)
        nc = plan.compress_capacity
    else:
        plan = pyplan.plan_prefill(seq, ext)
        nc = len(plan[0])
        if plan_kind == "tensors":
            plan = tuple(torch.from_numpy(r.view(np.uint8).reshape(-1, 16).copy()).to(dev) for r in plan)
        elif plan_kind == "host_tensors":
            plan = tuple(torch.from_numpy(r.view(np.uint8).reshape(-1, 16).copy()) for r in plan)
    state = torch.randn(b + 2, 1, 3 * d, generator=gen).to(dev, torch.bfloat16 if bf16 else torch.float32)
    args = dict(state=state, kv_score=torch.randn(n, 2 * d, generator=gen).to(dev),
                out=torch.full((nc if compact else n, d), float("nan"), device=dev), ape=torch.randn(128, d, generator=gen).to(dev),
                indices=torch.arange(b, dtype=torch.int32).to(dev), plan=plan,
                load_indices=(torch.arange(b, dtype=torch.int32).to(dev) + 1) if load else None)
    return args


def _decode_fill(args, flags, error_count):
    return dict(args, error_count=error_count), dict(flags=flags)


def _checked_bytes(checker, fill, sid, args, extra):
    """The params filled from the arguments as the checks return them (raises what the checks raise)."""
    checked, _ = checker(**args)
    ok, raw = _fill(fill, sid, checked, **extra)
    assert ok, "the filler declined arguments that passed the checks"
    return raw


# ---------------------------------------------------------------------------------------------
# Same bytes for valid arguments

@pytest.mark.parametrize("device", DEVICES)
@settings(max_examples=examples(40))
@given(d=st.sampled_from([64, 128, 192, 512]), b=st.integers(0, 40), slots=st.integers(1, 9), bf16=st.booleans(),
       pdl=st.booleans(), own_counter=st.booleans(), seed=st.integers(0, 2**31 - 1))
def test_decode_fills_the_same_params_through_every_reader(device, d, b, slots, bf16, pdl, own_counter, seed):
    dev = torch.device(device)
    args = _decode_args(dev, d, b, slots, bf16, torch.Generator().manual_seed(seed))
    counter = torch.zeros(1, dtype=torch.int32, device=dev) if own_counter else None
    args = dict(args, error_count=counter)
    ok, got = _both_readers(_calls.fill_decode, 2, args, flags=1 if pdl else 0)
    assert ok and got == _checked_bytes(c128._decode_checked, _calls.fill_decode, 2, args, dict(flags=1 if pdl else 0))


@pytest.mark.parametrize("device", DEVICES)
@settings(max_examples=examples(40))
@given(d=st.sampled_from([64, 128, 512]), extends=st.lists(st.integers(1, 400), min_size=1, max_size=6),
       bf16=st.booleans(), plan_kind=st.sampled_from(["arrays", "tensors", "host_tensors", "device_plan"]),
       compact=st.booleans(), load=st.booleans(), pdl=st.booleans(), cooperative=st.booleans(),
       own_counter=st.booleans(), seed=st.integers(0, 2**31 - 1))
def test_prefill_fills_the_same_params_through_every_reader(device, d, extends, bf16, plan_kind, compact, load, pdl,
                                                            cooperative, own_counter, seed):
    dev = torch.device(device)
    args = _prefill_args(dev, d, extends, bf16, plan_kind, compact, load, torch.Generator().manual_seed(seed))
    counter = torch.zeros(1, dtype=torch.int32, device=dev) if own_counter else None
    args = dict(args, error_count=counter, compact=compact)
    flags = c128._prefill_flags(pdl, cooperative)
    ok, got = _both_readers(_calls.fill_prefill, 3, args, flags=flags)
    assert ok and got == _checked_bytes(c128._prefill_checked, _calls.fill_prefill, 3, args, dict(flags=flags))


def _metadata_case(dev, mode, bs, width, expanded, real, flash, meta_shape):
    i32 = dict(dtype=torch.int32, device=dev)
    n = bs if mode == "decode" else expanded
    rows = bs if mode == "decode" else max(bs, 1) + 2
    src = dict(cache_seqlens=torch.arange(bs, **i32), cu_seqlens_k=torch.arange(bs + 1, **i32),
               page_indices=torch.arange(rows * width, **i32).view(rows, width),
               dsa_cache_seqlens=torch.arange(n, **i32), dsa_cu_seqlens_k=torch.arange(n + 1, **i32))
    dst = dict(cache_seqlens=torch.zeros(bs + 1, **i32), cu_seqlens_k=torch.zeros(bs + 2, **i32),
               page_table_1=torch.zeros(rows + 1, width + 3, **i32), dsa_cache_seqlens=torch.zeros(n + 1, **i32),
               dsa_cu_seqlens_k=torch.zeros(n + 2, **i32))
    if mode != "decode":
        src["seqlens_expanded"] = torch.arange(n, **i32)
        dst["seqlens_expanded"] = torch.zeros(n + 1, **i32)
    if real:
        src["real_page_table"] = torch.arange(rows * 5, **i32).view(rows, 5)
        dst["real_page_table"] = torch.zeros(rows, 6, **i32)
    if flash:
        numel = int(np.prod(meta_shape))
        src["num_splits"] = torch.arange(n + 1, **i32)
        src["flashmla_metadata"] = torch.arange(numel, **i32).view(meta_shape)
        dst["flashmla_num_splits"] = torch.zeros(n + 1, **i32)
        dst["flashmla_metadata"] = torch.zeros(numel, **i32)
    return src, dst


_SOURCE_ORDER = ("cache_seqlens", "cu_seqlens_k", "page_indices", "dsa_cache_seqlens", "dsa_cu_seqlens_k",
                 "seqlens_expanded", "real_page_table", "num_splits", "flashmla_metadata")


def _compiled_metadata(copy, src):
    before = bytes(copy._params)
    ok = _calls.fill_metadata_sources(copy._address, copy.decode, copy.has_real_page_table, copy.has_flashmla,
                                      *(src.get(k) for k in _SOURCE_ORDER))
    return ok, before, bytes(copy._params)


@pytest.mark.parametrize("device", DEVICES)
@settings(max_examples=examples(40))
@given(mode=st.sampled_from(["decode", "target_verify", "draft_extend"]), bs=st.integers(0, 20),
       width=st.integers(1, 40), expanded=st.integers(0, 30), real=st.booleans(), flash=st.booleans(),
       meta_shape=st.sampled_from([(7,), (3, 4), (2, 1, 5), (0,)]), k=st.integers(1, 3))
def test_metadata_fills_the_same_params_through_every_reader(device, mode, bs, width, expanded, real, flash,
                                                             meta_shape, k):
    src, dst = _metadata_case(torch.device(device), mode, bs, width, expanded, real, flash, meta_shape)
    checked = pydsa.MetadataCopy([dst] * k, mode=mode)
    checked._prepare(*(src.get(k) for k in _SOURCE_ORDER))  # the checks, then the filler
    compiled = pydsa.MetadataCopy([dst] * k, mode=mode)
    ok, before, got = _compiled_metadata(compiled, src)
    _calls.read_attributes_only(True)
    try:
        slow = pydsa.MetadataCopy([dst] * k, mode=mode)
        ok_slow, _, got_slow = _compiled_metadata(slow, src)
    finally:
        _calls.read_attributes_only(False)
    # equal but for the last field, each object's own destinations array
    assert ok and ok_slow and got[:-8] == bytes(checked._params)[:-8] == got_slow[:-8] and got[-8:] == before[-8:]


# ---------------------------------------------------------------------------------------------
# Arguments changed one at a time: where the checks raise, the filler declines and writes nothing;
# where they accept, the filler fills the same bytes from the checked arguments

def _variants(t, dev):
    """Changes to one tensor argument: most make it wrong, a few (a longer state) keep it valid."""
    out = [None, 3, "x", np.zeros(3, np.float32)]
    if not isinstance(t, torch.Tensor):
        return out
    other = torch.float64 if t.dtype != torch.float64 else torch.float32
    out += [t.to(other), t.unsqueeze(0), t.reshape(-1)[:-1] if t.numel() else t.reshape(-1)]
    if t.dim() >= 1:
        out.append(torch.cat([t, t[:1]]) if t.shape[0] else torch.zeros((1,) + tuple(t.shape[1:]), dtype=t.dtype,
                                                                          device=t.device))
    if t.dim() == 2 and t.shape[0] > 1 and t.shape[1] > 1:
        out.append(t.t().contiguous().t())  # same shape, column-major
    if t.dim() >= 1 and t.shape[-1] > 1:
        out.append(torch.cat([t, t], -1)[..., ::2])  # same shape, strided
        out.append(t[..., :-1])
    if dev.type == "cuda":
        out.append(t.cpu())
    return out


def _agree(checker, fill, sid, args, extra):
    """Returns True if the checks reject the arguments (and then the filler declined them too)."""
    ok, raw = _fill(fill, sid, args, **extra)
    try:
        expected = _checked_bytes(checker, fill, sid, args, extra)
    except (TypeError, ValueError):
        assert not ok and raw == POISON * SIZES[sid]
        return True
    assert not ok or raw == expected  # an array the filler cannot read itself is declined, then converted
    return False


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("as_bytes", [False, True])
def test_decode_records_fill_the_same_params_through_every_reader(device, as_bytes):
    """seq_lens None: the per-request records (int32 [B, 4] or uint8 [B, 16], sglang's plan_d) fill the
    params the checks fill, through both readers; other shapes and dtypes are declined by both, and
    the checks raise for them."""
    dev = torch.device(device)
    args = _decode_args(dev, 128, 3, 4, False, torch.Generator().manual_seed(1))
    rec = torch.stack([args.pop("seq_lens"), args["indices"], args["indices"], torch.full((3,), -1, dtype=torch.int32,
                                                                                        device=dev)], 1).contiguous()
    args = dict(args, indices=rec.view(torch.uint8).reshape(3, 16) if as_bytes else rec, seq_lens=None,
                error_count=torch.zeros(1, dtype=torch.int32, device=dev))
    ok, got = _both_readers(_calls.fill_decode, 2, args, flags=0)
    assert ok and got == _checked_bytes(c128._decode_checked, _calls.fill_decode, 2, args, dict(flags=0))
    for bad in (rec[:, :3].contiguous(), rec.long(), rec[:2], rec.t().contiguous().t()):
        bad_args = dict(args, indices=bad)
        assert _both_readers(_calls.fill_decode, 2, bad_args, flags=0)[0] is False
        with pytest.raises((TypeError, ValueError)):
            c128._decode_checked(**bad_args)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", ["state", "kv_score", "out", "ape", "indices", "seq_lens", "error_count"])
def test_decode_agrees_on_every_changed_argument(device, name):
    dev = torch.device(device)
    base = _decode_args(dev, 128, 3, 4, False, torch.Generator().manual_seed(0))
    base["error_count"] = torch.zeros(1, dtype=torch.int32, device=dev)
    rejected = 0
    for bad in _variants(base[name], dev):
        args = dict(base, **{name: bad})
        rejected += _agree(c128._decode_checked, _calls.fill_decode, 2, args, dict(flags=0))
    assert rejected >= 5


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("plan_kind", ["arrays", "tensors", "device_plan"])
@pytest.mark.parametrize("name", ["state", "kv_score", "out", "ape", "indices", "load_indices", "plan0", "plan1"])
def test_prefill_agrees_on_every_changed_argument(device, plan_kind, name):
    dev = torch.device(device)
    base = _prefill_args(dev, 64, [130, 5], False, plan_kind, False, True, torch.Generator().manual_seed(0))
    base = dict(base, error_count=None, compact=False)
    if name.startswith("plan"):
        if plan_kind == "device_plan":
            return  # a DevicePlan has no record arrays to change
        i = int(name[-1])
        records = base["plan"][i]
        wrong = [records[:, :8], records.float()] if plan_kind == "tensors" else [records.view(np.uint8), records[::2]]
        cases = [dict(base, plan=tuple(bad if j == i else r for j, r in enumerate(base["plan"])))
                 for bad in _variants(records, dev) + wrong]
        cases += [dict(base, plan=p) for p in (list(base["plan"]), base["plan"][:1], None)]
    else:
        cases = [dict(base, **{name: bad}) for bad in _variants(base[name], dev)]
    rejected = 0
    for args in cases:
        rejected += _agree(c128._prefill_checked, _calls.fill_prefill, 3, args, dict(flags=0))
    assert rejected >= 4


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("mode", ["decode", "target_verify"])
@pytest.mark.parametrize("name", _SOURCE_ORDER)
def test_metadata_agrees_on_every_changed_source(device, mode, name):
    dev = torch.device(device)
    src, dst = _metadata_case(dev, mode, 5, 9, 7, True, True, (3, 4))
    present = src.get(name)
    variants = _variants(present, dev) if present is not None else [torch.zeros(5, dtype=torch.int32, device=dev)]
    rejected = 0
    for bad in variants:
        case = dict(src, **{name: bad})
        checked = pydsa.MetadataCopy([dst, dst], mode=mode)
        compiled = pydsa.MetadataCopy([dst, dst], mode=mode)
        ok, before, after = _compiled_metadata(compiled, case)
        try:
            checked._prepare(*(case.get(k) for k in _SOURCE_ORDER))
        except (TypeError, ValueError):
            assert not ok and after == before, (name, bad)
            rejected += 1
            continue
        assert not ok or after[:-8] == bytes(checked._params)[:-8]
    assert rejected >= min(3, len(variants))


# ---------------------------------------------------------------------------------------------
# The one-shot calls take the compiled path

def test_one_shot_calls_launch_through_the_compiled_path(device, monkeypatch):
    def python_path(*args):
        raise AssertionError("the checks ran")

    dev = torch.device(device)
    gen = torch.Generator().manual_seed(3)
    args = _decode_args(dev, 64, 5, 6, False, gen)
    pydsa.c128_decode(*args.values())  # creates the default error counter once
    monkeypatch.setattr(c128, "_decode_checked", python_path)
    monkeypatch.setattr(c128, "_prefill_checked", python_path)
    monkeypatch.setattr(pydsa.metadata.MetadataCopy, "_prepare", python_path)
    pydsa.c128_decode(*args.values())
    for kind in ("arrays", "tensors", "device_plan"):
        p = _prefill_args(dev, 64, [200, 3], True, kind, kind == "tensors", True, gen)
        pydsa.c128_prefill(p.pop("state"), p.pop("kv_score"), p.pop("out"), p.pop("ape"), p.pop("indices"),
                           p.pop("plan"), load_indices=p.pop("load_indices"), compact=kind == "tensors")
    src, dst = _metadata_case(dev, "target_verify", 4, 8, 6, True, True, (2, 3))
    pydsa.MetadataCopy([dst, dst], mode="target_verify")(**src)
    assert torch.equal(dst["page_table_1"][:6, :8], src["page_indices"])
    # A numpy array is not something the filler reads: the checks convert it.
    host = {k: (v.cpu().numpy() if k != "state" else v.cpu()) for k, v in args.items()}
    with pytest.raises(AssertionError, match="the checks ran"):
        pydsa.c128_decode(*host.values())


def test_sglang_metadata_copy_takes_the_compiled_path(device, monkeypatch):
    from pydsa import sglang
    dev = torch.device(device)
    src, dst = _metadata_case(dev, "target_verify", 4, 8, 6, True, True, (2, 3))
    args = (src["cache_seqlens"], src["cu_seqlens_k"], src["page_indices"], src["dsa_cache_seqlens"],
            src["seqlens_expanded"], src["dsa_cu_seqlens_k"], src["real_page_table"], src["num_splits"],
            src["flashmla_metadata"], dst["cache_seqlens"], dst["cu_seqlens_k"], dst["page_table_1"],
            dst["dsa_cache_seqlens"], dst["seqlens_expanded"], dst["dsa_cu_seqlens_k"], dst["real_page_table"],
            dst["flashmla_num_splits"], dst["flashmla_metadata"])
    sglang.fused_metadata_copy_cuda(*args, 1, 4, 0, 8, 6)  # binds the destinations once
    for t in dst.values():
        t.zero_()

    def python_path(*a):
        raise AssertionError("the checks ran")

    monkeypatch.setattr(sglang, "_checked_flat", python_path)
    sglang.fused_metadata_copy_cuda(*args, 1, 4, 0, 8, 6)
    assert torch.equal(dst["page_table_1"][:6, :8], src["page_indices"])
    assert torch.equal(dst["flashmla_metadata"], src["flashmla_metadata"].reshape(-1))
    with pytest.raises(AssertionError, match="the checks ran"):  # a size that is not an int
        sglang.fused_metadata_copy_cuda(*args, 1, 4.0, 0, 8, 6)


def test_storing_and_speculative_one_shot_calls_take_the_filler_without_the_checks(device, monkeypatch):
    """Valid torch tensors never reach the checks: the storing decode, prefill and verify, the
    standalone store and both commits are filled and launched by the compiled filler alone."""
    from pydsa import speculative, store
    dev = torch.device(device)
    gen = torch.Generator().manual_seed(8)
    d, b, v = 128, 4, 3
    i32, i64 = dict(dtype=torch.int32, device=dev), dict(dtype=torch.int64, device=dev)
    cache = pydsa.KVCache(torch.zeros(64, pydsa.kv_page_bytes(d, 2), dtype=torch.uint8, device=dev),
                          (torch.rand(d, generator=gen) + 0.5).to(dev), torch.randn(2048, 64, generator=gen).to(dev),
                          page_size=2)
    state = torch.randn(b + b * (v + 1), 1, 3 * d, generator=gen).to(dev)
    ape, idx = torch.randn(128, d, generator=gen).to(dev), torch.arange(b, **i32)
    seq = torch.tensor([127, 255, 3, 1000], **i32)
    bank = torch.arange(b, b + b * (v + 1), v + 1, **i32)
    plan = pyplan.plan_prefill(np.array([300, 130]), np.array([300, 129]))
    pydsa.c128_decode(state, torch.randn(b, 2 * d, generator=gen).to(dev), None, ape, idx, seq + 1, store=cache,
                      cache_slots=torch.arange(b, **i64))  # the default counter exists from here on

    def checks(*args, **kwargs):
        raise AssertionError("the checks ran")

    for module, name in ((c128, "_decode_checked"), (c128, "_prefill_checked"), (speculative, "_verify_checked"),
                         (speculative, "_commit_checked"), (store, "_store_checked")):
        monkeypatch.setattr(module, name, checks)
    pydsa.c128_decode(state, torch.randn(b, 2 * d, generator=gen).to(dev), None, ape, idx, seq + 1, store=cache,
                      cache_slots=torch.arange(b, **i64))
    pydsa.c128_prefill(state, torch.randn(429, 2 * d, generator=gen).to(dev), None, ape, idx[:2], plan, store=cache,
                       cache_slots=torch.arange(429, **i64) % 128)
    pydsa.c128_verify(state, torch.randn(b * v, 2 * d, generator=gen).to(dev), None, ape, idx, seq, bank,
                      store=cache, cache_slots=torch.arange(b * v, **i64))
    pydsa.kv_store(torch.randn(b, d, generator=gen).to(dev), torch.arange(b, **i32), torch.arange(b, **i64), cache)
    accepted = torch.tensor([0, 3, 1, 2], **i32)
    pydsa.c128_commit(seq, accepted, idx, bank, load_indices=idx.clone(), num_drafts=v)
    pydsa.c128_commit(seq, accepted, idx, bank, states=[state, state.clone()], num_drafts=v)
    with pytest.raises(AssertionError, match="the checks ran"):  # a numpy array goes to the checks
        pydsa.kv_store(torch.randn(b, d).numpy(), torch.arange(b, dtype=torch.int32), torch.arange(b), cache)
