"""The call path's judges (pydsa/_read.pyx and the fillers, pydsa/_fill_*.pyx) and what they say.

For valid arguments a filler fills, through either of its readers (the DLPack exchange API, and the
attribute reader for a torch without it) and from DLPack views of other arrays (numpy), the same bytes (a
prepared call's params). For an argument that is wrong in any one way the filler raises the error naming it
(no prepared call is made)."""
import numpy as np
import pytest
import torch
from hypothesis import given, settings, strategies as st

import pydsa
import pyplan
from conftest import DEVICES, examples
from pydsa import _fill_metadata, _read
from pydsa._op import SIZES
from pydsa._tensors import error_counter

for _dev in [-1] + list(range(torch.cuda.device_count())):
    error_counter(_dev)  # the default counters exist (the first call of a process makes them)

DECODE_NAMES = ("state", "kv_score", "out", "ape", "indices", "seq_lens", "pdl", "error_count", "load_indices",
                "store", "cache_slots")
PREFILL_NAMES = ("state", "kv_score", "out", "ape", "indices", "plan", "load_indices", "pdl", "cooperative", "error_count",
                 "compact", "store", "cache_slots")


def _fill(op, args):
    """(params bytes or None, error or None) of the op's prepared form over `args`."""
    prepared = {"decode": pydsa.C128Decode, "prefill": pydsa.C128Prefill}[op]
    try:
        made = prepared(**args)
    except (TypeError, ValueError) as exc:
        return None, exc
    assert len(made._params) == SIZES[op]
    return made._params, None


def _every_reader(op, args):
    """The params through the exchange API, the attribute reader and numpy views (host): they agree."""
    first, err = _fill(op, args)
    assert err is None, err
    _read.read_attributes_only(True)
    try:
        second, err = _fill(op, args)
    finally:
        _read.read_attributes_only(False)
    assert err is None and first == second
    return first


def test_the_compiled_path_is_on_with_a_torch_that_has_the_exchange_api():
    # torch >= 2.10 exports the DLPack C exchange API; with an older torch the attribute reader runs.
    assert _read.available == hasattr(torch.Tensor, "__dlpack_c_exchange_api__")
    assert _read.available, f"torch {torch.__version__} lacks __dlpack_c_exchange_api__"


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



# ---------------------------------------------------------------------------------------------
# Same bytes for valid arguments

def _numpy_views(args):
    """Host arguments as numpy arrays (the state stays a tensor: its bf16 has no numpy dtype)."""
    return {k: (v.numpy() if isinstance(v, torch.Tensor) and k != "state" else v) for k, v in args.items()}


@pytest.mark.parametrize("device", DEVICES)
@settings(max_examples=examples(40))
@given(d=st.sampled_from([64, 128, 192, 512]), b=st.integers(0, 40), slots=st.integers(1, 9), bf16=st.booleans(),
       pdl=st.booleans(), own_counter=st.booleans(), seed=st.integers(0, 2**31 - 1))
def test_decode_fills_the_same_params_through_every_reader(device, d, b, slots, bf16, pdl, own_counter, seed):
    dev = torch.device(device)
    args = _decode_args(dev, d, b, slots, bf16, torch.Generator().manual_seed(seed))
    args.update(pdl=pdl,
                error_count=torch.zeros(1, dtype=torch.int32, device=dev) if own_counter else None)
    got = _every_reader("decode", args)
    if dev.type == "cpu":
        assert _fill("decode", _numpy_views(args)) == (got, None)


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
    args.update(compact=compact, pdl=pdl, cooperative=cooperative,
                error_count=torch.zeros(1, dtype=torch.int32, device=dev) if own_counter else None)
    got = _every_reader("prefill", args)
    if dev.type == "cpu" and plan_kind != "device_plan":
        assert _fill("prefill", _numpy_views(args)) == (got, None)


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
    """(params before, error or None, params after) of the sources' filler."""
    before = bytes(copy._params)
    try:
        _fill_metadata.fill_metadata_sources(copy._address, decode=copy.decode,
                                             has_real_page_table=copy.has_real_page_table,
                                             has_flashmla=copy.has_flashmla, **src)
    except (TypeError, ValueError) as exc:
        return before, exc, bytes(copy._params)
    return before, None, bytes(copy._params)


@pytest.mark.parametrize("device", DEVICES)
@settings(max_examples=examples(40))
@given(mode=st.sampled_from(["decode", "target_verify", "draft_extend"]), bs=st.integers(0, 20),
       width=st.integers(1, 40), expanded=st.integers(0, 30), real=st.booleans(), flash=st.booleans(),
       meta_shape=st.sampled_from([(7,), (3, 4), (2, 1, 5), (0,)]), k=st.integers(1, 3))
def test_metadata_fills_the_same_params_through_every_reader(device, mode, bs, width, expanded, real, flash,
                                                             meta_shape, k):
    src, dst = _metadata_case(torch.device(device), mode, bs, width, expanded, real, flash, meta_shape)
    fast = pydsa.MetadataCopy([dst] * k, mode=mode)
    before, err, got = _compiled_metadata(fast, src)
    _read.read_attributes_only(True)
    try:
        slow = pydsa.MetadataCopy([dst] * k, mode=mode)
        _, err_slow, got_slow = _compiled_metadata(slow, src)
    finally:
        _read.read_attributes_only(False)
    # equal but for the last field, each object's own destinations array
    assert err is None and err_slow is None and got[:-8] == got_slow[:-8] and got[-8:] == before[-8:]
    assert got != before or bs == 0


# ---------------------------------------------------------------------------------------------
# Arguments changed one at a time: the filler fills, or raises naming the argument and writes nothing

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


def _judged(op, name, args):
    """True if the filler refused the arguments (then naming `name`, no prepared call made)."""
    _, err = _fill(op, args)
    if err is None:
        return False
    said = str(err)
    # the changed argument, or one it no longer fits (a longer kv_score leaves out one row short)
    named = name in said or "head dim" in said or "tensors must be on" in said
    assert named or said.split(" ")[0].split("[")[0] in (DECODE_NAMES + PREFILL_NAMES), (name, said)
    return True


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("as_bytes", [False, True])
def test_decode_records_fill_the_same_params_through_every_reader(device, as_bytes):
    """seq_lens None: the per-request records (int32 [B, 4] or uint8 [B, 16]) fill the params through
    both readers; other shapes and dtypes are refused by name."""
    dev = torch.device(device)
    args = _decode_args(dev, 128, 3, 4, False, torch.Generator().manual_seed(1))
    rec = torch.stack([args.pop("seq_lens"), args["indices"], args["indices"], torch.full((3,), -1, dtype=torch.int32,
                                                                                        device=dev)], 1).contiguous()
    args = dict(args, indices=rec.view(torch.uint8).reshape(3, 16) if as_bytes else rec, seq_lens=None,
                error_count=torch.zeros(1, dtype=torch.int32, device=dev))
    _every_reader("decode", args)
    for bad in (rec[:, :3].contiguous(), rec.long(), rec[:2], rec.t().contiguous().t()):
        assert _judged("decode", "indices", dict(args, indices=bad))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", ["state", "kv_score", "out", "ape", "indices", "seq_lens", "error_count"])
def test_decode_judges_every_changed_argument(device, name):
    dev = torch.device(device)
    base = _decode_args(dev, 128, 3, 4, False, torch.Generator().manual_seed(0))
    base["error_count"] = torch.zeros(1, dtype=torch.int32, device=dev)
    rejected = sum(_judged("decode", name, dict(base, **{name: bad})) for bad in _variants(base[name], dev))
    assert rejected >= 5


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("plan_kind", ["arrays", "tensors", "device_plan"])
@pytest.mark.parametrize("name", ["state", "kv_score", "out", "ape", "indices", "load_indices", "plan0", "plan1"])
def test_prefill_judges_every_changed_argument(device, plan_kind, name):
    dev = torch.device(device)
    base = _prefill_args(dev, 64, [130, 5], False, plan_kind, False, True, torch.Generator().manual_seed(0))
    if name.startswith("plan"):
        if plan_kind == "device_plan":
            return  # a DevicePlan has no record arrays to change
        i = int(name[-1])
        records = base["plan"][i]
        wrong = [records[:, :8], records.float()] if plan_kind == "tensors" else [records.view(np.uint8), records[::2]]
        cases = [dict(base, plan=tuple(bad if j == i else r for j, r in enumerate(base["plan"])))
                 for bad in _variants(records, dev) + wrong]
        cases += [dict(base, plan=p) for p in (base["plan"][:1], None)]
        name = "plan"
    else:
        cases = [dict(base, **{name: bad}) for bad in _variants(base[name], dev)]
    rejected = sum(_judged("prefill", name, args) for args in cases)
    assert rejected >= 4


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("mode", ["decode", "target_verify"])
@pytest.mark.parametrize("name", _SOURCE_ORDER)
def test_metadata_judges_every_changed_source(device, mode, name):
    dev = torch.device(device)
    src, dst = _metadata_case(dev, mode, 5, 9, 7, True, True, (3, 4))
    present = src.get(name)
    variants = _variants(present, dev) if present is not None else [torch.zeros(5, dtype=torch.int32, device=dev)]
    rejected = 0
    for bad in variants:
        copy = pydsa.MetadataCopy([dst, dst], mode=mode)
        before, err, after = _compiled_metadata(copy, dict(src, **{name: bad}))
        if err is not None:
            assert after == before, (name, bad)
            said = str(err)  # the changed source, or one it no longer fits
            assert name in said or said.split(":")[0].split(" ")[0] in _SOURCE_ORDER + ("num_splits/flashmla_metadata",), said
            rejected += 1
    assert rejected >= min(3, len(variants))



def test_a_prepared_call_cannot_be_copied_or_pickled_and_a_failed_one_may_be_retried():
    """A prepared call points into its arguments' memory: copy and pickle refuse it with pydsa's words; a
    construction that failed (nothing filled) may run __init__ again, and then launches; a filled one may not."""
    import copy
    import pickle
    d = 128
    state, kv, ape = torch.randn(2, 1, 3 * d), torch.randn(1, 2 * d), torch.randn(128, d)
    idx, seq = torch.tensor([0], dtype=torch.int32), torch.tensor([5], dtype=torch.int32)
    made = pydsa.C128Decode(state, kv, torch.empty(1, d), ape, idx, seq)
    for how in (copy.copy, copy.deepcopy, pickle.dumps):
        with pytest.raises(TypeError, match="C128Decode points into its arguments' memory"):
            how(made)
    fresh = pydsa.C128Decode.__new__(pydsa.C128Decode)
    with pytest.raises(pydsa.ArgumentError):
        fresh.__init__(state, None, torch.empty(1, d), ape, idx, seq)
    out = torch.full((1, d), float("nan"))
    fresh.__init__(state, kv, out, ape, idx, seq)
    before = state.clone()
    fresh.launch()
    assert not torch.equal(state, before)  # the decode ran: the slot's state moved
    with pytest.raises(RuntimeError, match="filled once"):
        fresh.__init__(state, kv, out, ape, idx, seq)
