"""pydsa.sglang: sglang's call signatures over the library's ops, on the host backend and the GPU.

Every case fills each argument with its own random values, so a swapped pair of arguments shows
up as a wrong destination; results are compared with a per-field torch reference written from
sglang's conventions (bit for bit) and with the main API."""
import numpy as np
import pytest
import torch
from hypothesis import given, settings, strategies as st

import pydsa
import pyplan
from conftest import DEVICES, examples
from pydsa import sglang
from reference import TokenStream, rel_err

I32 = torch.int32
FILL = -7


def _reference_copy(src, dst, mode, bs, max_len, max_seqlen_k, expanded):
    """sglang's fused metadata copy written as per-field copies (flat source reads)."""
    cache_seqlens, cu, pages, nsa_cache, seqlens_expanded, nsa_cu, real, splits, meta = src
    d_cache, d_cu, d_table, d_nsa_cache, d_expanded, d_nsa_cu, d_real, d_splits, d_meta = dst
    rows, cols = (bs, max_len) if mode == 0 else (pages.shape[0], max_seqlen_k)
    n = bs if mode == 0 else expanded
    d_cache[:bs] = cache_seqlens[:bs]
    d_cu[1:bs + 1] = cu[1:bs + 1]
    flat_table = d_table.as_strided((d_table.shape[0], d_table.shape[1]), (d_table.shape[1], 1))
    flat_table[:rows, :cols] = pages.reshape(-1)[:rows * cols].view(rows, cols)
    if mode != 0:
        d_expanded[:n] = seqlens_expanded[:n]
    d_nsa_cache[:n] = nsa_cache[:n]
    d_nsa_cu[1:n + 1] = nsa_cu[1:n + 1]
    if real is not None:
        rc = real.shape[1]
        d_real[:rows, :rc] = real.reshape(-1)[:rows * rc].view(rows, rc)
    if splits is not None:
        d_splits[:n + 1] = splits[:n + 1]
        d_meta.view(-1)[:meta.numel()] = meta.reshape(-1)


@st.composite
def metadata_cases(draw):
    mode = draw(st.sampled_from([0, 1, 2]))
    bs = draw(st.integers(1, 40))
    max_len = draw(st.sampled_from([1, 17, 128, 129, 300]))
    max_seqlen_k = draw(st.sampled_from([1, 64, 257]))
    expanded = draw(st.integers(1, 60))
    return (mode, bs, max_len, max_seqlen_k, expanded, draw(st.booleans()), draw(st.booleans()),
            draw(st.integers(0, 2**31)))


def _metadata_args(device, case):
    mode, bs, max_len, max_seqlen_k, expanded, real, flashmla, seed = case
    gen = torch.Generator().manual_seed(seed)

    def r(*shape):
        return torch.randint(0, 1 << 30, shape, generator=gen, dtype=I32).to(device)

    def poisoned(*shape):
        return torch.full(shape, FILL, dtype=I32, device=device)

    rows = bs if mode == 0 else expanded
    cols = max_len if mode == 0 else max_seqlen_k
    n = bs if mode == 0 else expanded
    src = [r(bs + 2), r(bs + 3), r(rows, cols + 3), r(n + 1), r(n + 2), r(n + 4),
           r(rows, 11) if real else None, r(n + 2) if flashmla else None, r(3, 7) if flashmla else None]
    # Destinations wider than needed; the page table a column slice of a wider buffer.
    table = poisoned(rows + 2, cols + 40)[:, :cols + 5]
    dst = [poisoned(bs + 5), poisoned(bs + 6), table, poisoned(n + 3), poisoned(n + 3), poisoned(n + 5),
           poisoned(rows + 1, 20)[:, :15] if real else None, poisoned(n + 4) if flashmla else None,
           poisoned(4, 7) if flashmla else None]
    if mode == 0:
        src[4] = r(5)  # sglang passes seqlens_expanded in DECODE too; it is ignored
    return src, dst, (mode, bs, max_len, max_seqlen_k, expanded)


@pytest.mark.parametrize("device_name", DEVICES)
@settings(max_examples=examples(40))
@given(metadata_cases())
def test_fused_metadata_copy_equals_sglang_per_field_copies(device_name, case):
    """fused_metadata_copy_cuda writes exactly what sglang's per-field copies write, in every
    mode with and without the optional groups, and nothing else."""
    device = torch.device(device_name)
    src, dst, (mode, bs, max_len, max_seqlen_k, expanded) = _metadata_args(device, case)
    want = [None if t is None else t.clone() for t in dst]
    base = dst[2]._base  # the page table is a column slice of a wider buffer: compare all of it
    want_base = base.clone()
    want[2] = want_base.as_strided(dst[2].shape, dst[2].stride(), dst[2].storage_offset())
    _reference_copy(src, want, mode, bs, max_len, max_seqlen_k, expanded)
    sglang.fused_metadata_copy_cuda(*src, *dst, mode, bs, max_len, max_seqlen_k, expanded)
    assert torch.equal(base, want_base), "page_table_1"
    for k, (got, w) in enumerate(zip(dst, want)):
        if got is not None and k != 2:
            assert torch.equal(got, w), f"destination {k}"


@pytest.mark.parametrize("device_name", DEVICES)
@pytest.mark.parametrize("options", [(False, False), (True, True)])
def test_multi_copy_equals_three_single_copies(device_name, options):
    """fused_metadata_copy_multi_cuda (35 arguments) fills three backends as three single DECODE
    copies would."""
    device = torch.device(device_name)
    real, flashmla = options
    src, dst, (_, bs, max_len, _, _) = _metadata_args(device, (0, 9, 130, 1, 1, real, flashmla, 3))
    groups = []
    for k in range(3):
        _, d, _ = _metadata_args(device, (0, 9, 130, 1, 1, real, flashmla, 10 + k))
        d[2] = d[2].contiguous()  # the column-slice layout has its own test above
        groups.append(d)
    want = [[None if t is None else t.clone() for t in g] for g in groups]
    for g in want:
        sglang.fused_metadata_copy_cuda(*src, *g, 0, bs, max_len, 0, 0)
    drop = lambda xs: [x for i, x in enumerate(xs) if i != 4]  # noqa: E731 - no seqlens_expanded here
    sglang.fused_metadata_copy_multi_cuda(*drop(src), *drop(groups[0]), *drop(groups[1]), *drop(groups[2]),
                                          bs, max_len, 0)
    for g, w in zip(groups, want):
        for got, exp in zip(g, w):
            if got is not None:
                assert torch.equal(got, exp)


def test_argument_order_is_sglangs(device):
    """Swapping two same-shaped sources (cache_seqlens and nsa_cache_seqlens) changes what lands
    where: the positions are not interchangeable."""
    src, dst, (mode, bs, max_len, max_seqlen_k, expanded) = _metadata_args(device, (0, 4, 17, 1, 1, False, False, 1))
    src[3] = src[0].clone()[:4] + 1
    sglang.fused_metadata_copy_cuda(*src, *dst, mode, bs, max_len, max_seqlen_k, expanded)
    assert torch.equal(dst[0][:4], src[0][:4]) and torch.equal(dst[3][:4], src[3][:4])


def test_non_int32_raises_runtime_error_like_sglang(device):
    src, dst, (mode, bs, max_len, max_seqlen_k, expanded) = _metadata_args(device, (1, 3, 17, 9, 5, True, True, 2))
    src[2] = src[2].long()
    with pytest.raises(RuntimeError, match="page_indices_src must have dtype int32"):
        sglang.fused_metadata_copy_cuda(*src, *dst, mode, bs, max_len, max_seqlen_k, expanded)
    src[2] = src[2].int()
    dst[5] = dst[5].float()
    with pytest.raises(RuntimeError, match="nsa_cu_seqlens_k_dst must have dtype int32"):
        sglang.fused_metadata_copy_cuda(*src, *dst, mode, bs, max_len, max_seqlen_k, expanded)


def test_main_api_takes_two_dimensional_flashmla_metadata(device):
    """MetadataCopy copies a [num_sm_parts, 8] FlashMLA metadata tensor flat, like the per-field copy."""
    src, dst, _ = _metadata_args(device, (0, 5, 33, 1, 1, False, True, 4))
    keys = ("cache_seqlens", "cu_seqlens_k", "page_table_1", "dsa_cache_seqlens", "seqlens_expanded",
            "dsa_cu_seqlens_k", "real_page_table", "flashmla_num_splits", "flashmla_metadata")
    dest = {k: v for k, v in zip(keys, dst) if v is not None and k != "seqlens_expanded"}
    dest["page_table_1"] = torch.full((5, 40), FILL, dtype=I32, device=device)
    meta = src[8]  # [3, 7]
    pydsa.MetadataCopy(dest)(src[0][:5], src[1][:6], src[2].reshape(-1)[:5 * 33].view(5, 33), src[3][:5],
                             src[5][:6], num_splits=src[7][:6], flashmla_metadata=meta)
    assert torch.equal(dest["flashmla_metadata"].view(-1)[:21], meta.reshape(-1))
    assert bool((dest["flashmla_metadata"].view(-1)[21:] == FILL).all())


# ---------------------------------------------------------------------------------------------
# Online c128


def test_c128_online_calls_equal_the_main_api_and_the_formula(device):
    """c128_online_prefill with uint8 [M, 16] plan tensors filled by plan_compress_online_prefill
    (plain and CUDA-graph mode), then c128_online_decode, give the main API's results, and every
    chunk vector is within 1e-5 of the float64 formula."""
    d = 128
    stream = TokenStream(d, 4)
    ape = torch.from_numpy(np.random.default_rng(4).standard_normal((128, d), dtype=np.float32))
    seq = torch.tensor([300, 129, 70], dtype=torch.int64)
    ext = torch.tensor([300, 129, 70], dtype=torch.int64)
    m = int(ext.sum())
    rows = torch.from_numpy(np.concatenate([stream.rows(b, 0, int(e)) for b, e in enumerate(ext.tolist())]))
    idx = torch.tensor([2, 0, 4], dtype=I32, device=device)
    for graph in (False, True):
        compress_plan = torch.empty(m, 16, dtype=torch.uint8)
        write_plan = torch.empty(m, 16, dtype=torch.uint8)
        nc, nw = sglang.plan_compress_online_prefill(ext, seq, compress_plan, write_plan, graph)
        want_c, want_w = pyplan.plan_prefill(seq.numpy(), ext.numpy())
        assert (nc, nw) == ((m, m) if graph else (len(want_c), len(want_w)))
        got_c = compress_plan[:len(want_c)].numpy().view(pyplan.SEGMENT_DTYPE).reshape(-1)
        assert got_c.tolist() == want_c.tolist()
        if graph:
            assert bool((compress_plan[len(want_c):] == 255).all()) and bool((write_plan[len(want_w):] == 255).all())
        state = torch.full((5, 1, 3 * d), float("nan"), device=device)
        out = torch.full((m, d), float("nan"), device=device)
        sglang.c128_online_prefill(state, rows.to(device), out, ape.to(device), idx,
                                   compress_plan[:nc].to(device), write_plan[:nw].to(device), None,
                                   cooperative=not graph)
        state2 = torch.full((5, 1, 3 * d), float("nan"), device=device)
        out2 = torch.full((m, d), float("nan"), device=device)
        pydsa.c128_prefill(state2, rows.to(device), out2, ape.to(device), idx, (want_c, want_w))
        # The padded graph-mode plan may run with another tile layout than the exact plan: equal to
        # fp32 rounding.
        assert torch.equal(out.isnan(), out2.isnan()) and torch.equal(state.isnan(), state2.isnan())
        torch.testing.assert_close(out.nan_to_num(), out2.nan_to_num(), rtol=2e-6, atol=2e-6)
        torch.testing.assert_close(state.nan_to_num(), state2.nan_to_num(), rtol=2e-6, atol=2e-6)
        for rid, b, pos, _ in want_c.tolist():
            vec = out[rid].cpu().numpy()
            assert rel_err(vec, stream.chunk_vector(b, pos // 128, ape.numpy())) < 1e-5
    # Decode request 1 (at 129) to the end of its second chunk.
    for pos in range(129, 256):
        kv = torch.from_numpy(stream.rows(1, pos, pos + 1)).to(device)
        o = torch.full((1, d), float("nan"), device=device)
        sglang.c128_online_decode(state, kv, o, ape.to(device), idx[1:2], torch.tensor([pos + 1], dtype=I32, device=device))
    assert rel_err(o.cpu().numpy()[0], stream.chunk_vector(1, 1, ape.numpy())) < 1e-5


def test_planner_refuses_a_token_count_that_disagrees(device):
    ext = torch.tensor([10, 20], dtype=torch.int64)
    plans = torch.zeros(31, 16, dtype=torch.uint8), torch.zeros(31, 16, dtype=torch.uint8)
    with pytest.raises(ValueError, match="compress_plan.s row count is 31 but the extends sum to 30"):
        sglang.plan_compress_online_prefill(ext, ext, *plans, True)
    assert bool((plans[0] == 0).all()), "nothing written on refusal"
    with pytest.raises(RuntimeError, match="extend_lens must have dtype int64"):
        sglang.plan_compress_online_prefill(ext.int(), ext, *plans, False)


# ---- online_c128_mtp (speculative decoding) ---------------------------------------------------

def _reference_write_prefix(kv, seq, req, ape, state, bs, v, stride):
    """sglang 0.5.23's write_prefix_states as documented, in float64: the running state from the
    main slot (fresh at a chunk start), bank k+1 written after draft k unless it ends a chunk."""
    d = ape.shape[1]
    out = state.clone().double()
    for b in range(bs):
        s0, r = int(seq[b]), int(req[b])
        start = s0 & 127
        if s0 > 0 and start != 0:
            m, s, k = (out[r, :d].clone(), out[r, d:2 * d].clone(), out[r, 2 * d:].clone())
        else:
            m = s = k = torch.zeros(d, dtype=torch.float64)
        for j in range(v):
            pos = (start + j) & 127
            x = kv[b * v + j].double()
            t = x[d:] + ape[pos].double()
            if pos == 0:
                m, s, k = t, torch.ones(d, dtype=torch.float64), x[:d]
            else:
                mm = torch.maximum(m, t)
                a, e = s * torch.exp(m - mm), torch.exp(t - mm)
                k, s, m = (k * a + x[:d] * e) / (a + e), a + e, mm
            if (s0 + j + 1) & 127:
                out[r + (j + 1) * stride] = torch.cat([m, s, k])
            else:
                m = s = k = torch.zeros(d, dtype=torch.float64)
    return out


@pytest.mark.parametrize("device_name", DEVICES)
@pytest.mark.parametrize("state_dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("index_dtype", [torch.int32, torch.int64], ids=["i32", "i64"])
@settings(max_examples=examples(10))
@given(bs=st.integers(1, 6), v=st.integers(1, 8), seed=st.integers(0, 2**16))
def test_online_c128_mtp_against_sglang_semantics(device_name, state_dtype, index_dtype, bs, v, seed):
    """write_prefix_states, mark_pending and commit_pending with sglang's signatures equal a per-field
    torch reference of sglang 0.5.23's documented semantics: bank rows within fp32 rounding (bf16: one
    rounding), pending lengths and committed main slots exactly."""
    dev = torch.device(device_name)
    gen = torch.Generator().manual_seed(seed)
    d, pool = 64, bs + 3
    stride = pool
    state = torch.randn(stride * (v + 1), 3 * d, generator=gen)
    state[:, d:2 * d] = torch.rand(stride * (v + 1), d, generator=gen) + 1
    state = state.to(state_dtype)
    req = torch.randperm(pool, generator=gen)[:bs].to(index_dtype)
    seq = torch.randint(1, 700, (bs,), generator=gen)
    seq[0] = 128 * int(torch.randint(1, 4, (1,), generator=gen)) - int(torch.randint(0, v + 1, (1,), generator=gen))
    seq = seq.clamp(min=1).to(index_dtype)
    kv = torch.randn(bs * v + 2, 2 * d, generator=gen)
    ape = torch.randn(128, d, generator=gen)
    r2t = torch.zeros(pool, 4, dtype=torch.int32)
    want = _reference_write_prefix(kv, seq, req, ape, state.float(), bs, v, stride)
    st_ = state.to(dev)
    sglang.online_c128_mtp_write_prefix_states(kv.to(dev), seq.to(dev), req.to(dev), r2t.to(dev), ape.to(dev), st_,
                                               bs, v, stride, head_dim=d)
    tol = dict(rtol=2e-5, atol=2e-5) if state_dtype == torch.float32 else dict(rtol=2e-2, atol=2e-2)
    torch.testing.assert_close(st_.cpu().double(), want.to(state_dtype).double(), **tol)
    # mark_pending: every row cleared, then this batch's lengths.
    pending = torch.full((pool + 2,), 99, dtype=torch.int64)
    sglang.online_c128_mtp_mark_pending(seq.to(dev), req.to(dev), pending_dev := pending.to(dev), bs, pool,
                                        head_dim=d, state_dtype=state_dtype)
    want_pending = torch.full((pool + 2,), 99, dtype=torch.int64)
    want_pending[:pool] = -1
    want_pending[req.long()] = seq.long()
    assert torch.equal(pending_dev.cpu(), want_pending)
    # commit_pending: the next step's lengths, some requests not in the verify batch.
    cur = seq.long() + torch.randint(-1, v + 2, (bs,), generator=gen)
    before = st_.clone()
    sglang.online_c128_mtp_commit_pending(cur.to(index_dtype).to(dev), req.to(dev), r2t.to(dev), pending_dev, st_, bs,
                                          v, stride, pool, head_dim=d)
    want_state = before.cpu().clone()
    for b in range(bs):
        r = int(req[b])
        accept = max(0, min(v, int(cur[b]) - int(want_pending[r])))
        if accept and (int(want_pending[r]) + accept) & 127:
            want_state[r] = before.cpu()[r + accept * stride]
    assert torch.equal(st_.cpu(), want_state)
