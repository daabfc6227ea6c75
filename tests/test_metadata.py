"""Fused DSA metadata copy (docs/spec.md, metadata copy): bit-exact equality with the per-field copy sequence, nothing
outside the copied region touched, K destinations, graphs, and every error case."""
import ctypes

import pytest
import torch
from hypothesis import given, settings, strategies as st

import c_structs
import pydsa
from pydsa import _abi
from conftest import DEVICES, examples, gpu
from pydsa.baselines import metadata_copy_torch as metadata_copy_reference

SENTINEL = -777
AWKWARD = [0, 1, 17, 97, 127, 128, 129, 255, 256, 257]


def rand_i32(*shape, device, gen):
    return torch.randint(-2**31, 2**31 - 1, shape, dtype=torch.int32, generator=gen).to(device)


def make_case(device, mode, bs, width, expanded, real_cols, meta, k, extra, seed):
    gen = torch.Generator().manual_seed(seed)
    decode = mode == "decode"
    n = bs if decode else expanded
    rows = bs if decode else expanded
    src = dict(cache_seqlens=rand_i32(bs, device=device, gen=gen),
               cu_seqlens_k=rand_i32(bs + 1, device=device, gen=gen),
               page_indices=rand_i32(rows, width, device=device, gen=gen),
               dsa_cache_seqlens=rand_i32(n, device=device, gen=gen),
               dsa_cu_seqlens_k=rand_i32(n + 1, device=device, gen=gen))
    if not decode:
        src["seqlens_expanded"] = rand_i32(n, device=device, gen=gen)
    if real_cols is not None:
        src["real_page_table"] = rand_i32(rows, real_cols, device=device, gen=gen)
    if meta is not None:
        src["num_splits"] = rand_i32(n + 1, device=device, gen=gen)
        src["flashmla_metadata"] = rand_i32(meta, device=device, gen=gen)

    def buf(*shape):
        return torch.full(shape, SENTINEL, dtype=torch.int32, device=device)

    dsts = []
    for j in range(k):
        e = extra + j  # destinations larger than the sources, differently per backend
        d = dict(cache_seqlens=buf(bs + e), cu_seqlens_k=buf(bs + 1 + e),
                 page_table_1=buf(rows + e, width + 3 * e + 1)[:, :width + 2 * e + 1],
                 dsa_cache_seqlens=buf(n + e), dsa_cu_seqlens_k=buf(n + 1 + e))
        if not decode:
            d["seqlens_expanded"] = buf(n + e)
        if real_cols is not None:
            d["real_page_table"] = buf(rows + e, real_cols + 2 * e + 1)
        if meta is not None:
            d["flashmla_num_splits"] = buf(n + 1 + e)
            d["flashmla_metadata"] = buf(meta + e)
        dsts.append(d)
    return src, dsts


@st.composite
def cases(draw):
    mode = draw(st.sampled_from(["decode", "target_verify", "draft_extend"]))
    bs = draw(st.one_of(st.sampled_from(AWKWARD), st.integers(0, 512)))
    width = draw(st.one_of(st.sampled_from([1, 3, 4, 5, 127, 128, 129, 4095, 4096, 4097]), st.integers(1, 600)))
    expanded = draw(st.integers(0, 3)) * bs + draw(st.integers(0, 2))
    real_cols = draw(st.one_of(st.none(), st.integers(1, 70)))
    meta = draw(st.one_of(st.none(), st.integers(1, 300)))
    k = draw(st.one_of(st.integers(1, 3), st.just(8)))
    extra = draw(st.integers(0, 5))
    if bs * width > 60000:  # keep the host suite quick; large shapes run in the GPU tests
        width = max(1, 60000 // max(bs, 1))
    return mode, bs, width, expanded, real_cols, meta, k, extra, draw(st.integers(0, 2**31))


def run_case(device, case):
    mode, bs, width, expanded, real_cols, meta, k, extra, seed = case
    src, dsts = make_case(device, mode, bs, width, expanded, real_cols, meta, k, extra, seed)
    want = [{key: t.clone() for key, t in d.items()} for d in dsts]
    if bs > 0:
        for w in want:
            metadata_copy_reference(src, w, mode)
    copy = pydsa.MetadataCopy(dsts, mode=mode)
    copy(**src)
    return dsts, want


@pytest.mark.parametrize("device_name", DEVICES)
@settings(max_examples=examples(60))
@given(cases())
def test_equals_per_field_copies_and_touches_nothing_else(device_name, case):
    """Every destination equals the per-field torch copy sequence bit for bit, over the whole
    buffer: nothing outside the copied region (element 0 of the cu_seqlens arrays included)
    changes; K destinations equal K single copies."""
    dsts, want = run_case(torch.device(device_name), case)
    for got, ref in zip(dsts, want):
        for key in ref:
            assert torch.equal(got[key], ref[key]), key


@gpu
@pytest.mark.gpu
@pytest.mark.parametrize("bs", [200, 300])
def test_copies_around_the_tile_size_switch(bs):
    """The kernel cuts rows into small tiles, or into large ones once the small ones number over two
    per resident block (on an H200 200 rows of 16383 elements stay below, 300 go above): both
    equal the per-field sequence bit for bit, with every optional group and three destinations."""
    dsts, want = run_case(torch.device("cuda"), ("decode", bs, 16383, 0, 70, 300, 3, 2, bs))
    for got, ref in zip(dsts, want):
        for key in ref:
            assert torch.equal(got[key], ref[key]), key


@pytest.mark.parametrize("k", [1, 3])
@pytest.mark.parametrize("shape", [(2, 16, None, 5001, 0), (1, 16, 5003, None, 0), (3, 9000, None, None, 1),
                                   (3, 9000, None, None, 0)], ids=["flashmla", "real-one-row", "page-aligned",
                                                                   "page-unaligned"])
def test_largest_job_of_any_field(device, shape, k):
    """The job with the most tiles is copied without a job lookup when each of its rows is 16-byte
    aligned at the source and every destination: whichever field it is (the FlashMLA metadata, a
    one-row real page table, the page table), with aligned destination strides or not (with K = 3
    one destination's stride is always unaligned), every destination equals the per-field sequence."""
    bs, width, real_cols, meta, extra = shape
    dsts, want = run_case(device, ("decode", bs, width, 0, real_cols, meta, k, extra, 7))
    for got, ref in zip(dsts, want):
        for key in ref:
            assert torch.equal(got[key], ref[key]), key


def refill_and_check(src, dsts, mode, run, steps=3):
    """Refills the sources in place with new random contents, run()s the bound or captured copy
    and compares every destination with the per-field sequence."""
    for step in range(steps):
        gen = torch.Generator().manual_seed(step)
        for t in src.values():
            t.copy_(rand_i32(*t.shape, device=t.device, gen=gen))
        want = [{k: t.clone() for k, t in d.items()} for d in dsts]
        for w in want:
            metadata_copy_reference(src, w, mode)
        run()
        for got, ref in zip(dsts, want):
            assert all(torch.equal(got[k], ref[k]) for k in ref)


@pytest.mark.parametrize("misalign", [0, 1, 2, 3])
@pytest.mark.parametrize("bs, width", [(5, 1000), (37, 4100), (230, 1000)])
def test_unaligned_rows_and_strides(device, misalign, bs, width):
    """Destination rows that do not share the source's 16-byte alignment still copy exactly, with
    three destinations each misaligned differently. On an H200 each shape takes one launch form: a
    few tiles (5 x 1000) one block per tile and destination, up to 1.5 tiles per SM (37 x 4100) one
    block of 128 threads per tile, more tiles (230 x 1000) one block of 64 threads per tile."""
    gen = torch.Generator().manual_seed(misalign)
    src = dict(cache_seqlens=rand_i32(bs, device=device, gen=gen), cu_seqlens_k=rand_i32(bs + 1, device=device, gen=gen),
               page_indices=rand_i32(bs, width, device=device, gen=gen),
               dsa_cache_seqlens=rand_i32(bs, device=device, gen=gen), dsa_cu_seqlens_k=rand_i32(bs + 1, device=device, gen=gen))
    bigs, dsts = [], []
    for k in range(3):
        shift = (misalign + k) % 4
        big = torch.full((bs * (width + 7) + 8,), SENTINEL, dtype=torch.int32, device=device)
        bigs.append((big, shift))
        dsts.append(dict(cache_seqlens=torch.full((bs,), SENTINEL, dtype=torch.int32, device=device),
                         cu_seqlens_k=torch.full((bs + 1,), SENTINEL, dtype=torch.int32, device=device),
                         page_table_1=big[shift:shift + bs * (width + 7)].view(bs, width + 7),
                         dsa_cache_seqlens=torch.full((bs,), SENTINEL, dtype=torch.int32, device=device),
                         dsa_cu_seqlens_k=torch.full((bs + 1,), SENTINEL, dtype=torch.int32, device=device)))
    want_bigs, wants = [], []
    for (big, shift), dst in zip(bigs, dsts):
        want_big = big.clone()
        want = {key: t.clone() for key, t in dst.items()}
        want["page_table_1"] = want_big[shift:shift + bs * (width + 7)].view(bs, width + 7)
        metadata_copy_reference(src, want, "decode")
        want_bigs.append(want_big), wants.append(want)
    pydsa.MetadataCopy(dsts)(**src)
    for (big, _), want_big, dst, want in zip(bigs, want_bigs, dsts, wants):
        assert torch.equal(big, want_big)
        for key in dst:
            assert torch.equal(dst[key], want[key]), key


def test_zero_batch_is_a_no_op(device):
    src, dsts = make_case(device, "decode", 0, 8, 0, None, None, 2, 1, 0)
    before = [{k: t.clone() for k, t in d.items()} for d in dsts]
    pydsa.MetadataCopy(dsts)(**src)
    assert all(torch.equal(d[k], b[k]) for d, b in zip(dsts, before) for k in d)


@gpu
@pytest.mark.gpu
def test_cuda_graph_replay_sees_new_source_contents():
    """Capture the bound call; change the sources' contents; replay; compare. A smaller batch in
    the same buffers (sizes within capacity) is a new call of the bound object."""
    dev = torch.device("cuda")
    src, dsts = make_case(dev, "decode", 64, 1000, 0, 40, 100, 3, 2, 1)
    copy = pydsa.MetadataCopy(dsts)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        copy(**src)
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        copy(**src)

    def replay():
        graph.replay()
        torch.cuda.synchronize()

    refill_and_check(src, dsts, "decode", replay)
    small = {k: v[:10] for k, v in src.items()}
    small["cu_seqlens_k"] = src["cu_seqlens_k"][:11]
    small["num_splits"] = src["num_splits"][:11]
    small["dsa_cu_seqlens_k"] = src["dsa_cu_seqlens_k"][:11]
    small["flashmla_metadata"] = src["flashmla_metadata"]
    want = [{k: t.clone() for k, t in d.items()} for d in dsts]
    for w in want:
        metadata_copy_reference(small, w, "decode")
    copy(**small)
    torch.cuda.synchronize()
    for got, ref in zip(dsts, want):
        assert all(torch.equal(got[k], ref[k]) for k in ref)


@gpu
@pytest.mark.gpu
def test_page_table_offsets_beyond_32_bits():
    """A 512 x 4.2M-column page table: element offsets exceed 2^31; the last rows land right."""
    dev = torch.device("cuda")
    free, _ = torch.cuda.mem_get_info()
    rows, width = 520, (1 << 22) + 3
    if free < 3 * rows * width * 4:
        pytest.skip("not enough GPU memory for a >2^31-element page table")
    gen = torch.Generator(device=dev).manual_seed(1)
    src_table = torch.randint(0, 2**30, (rows, width), dtype=torch.int32, device=dev, generator=gen)
    dst_table = torch.full((rows, width + 5), SENTINEL, dtype=torch.int32, device=dev)
    i32 = dict(dtype=torch.int32, device=dev)
    src = dict(cache_seqlens=torch.arange(rows, **i32), cu_seqlens_k=torch.arange(rows + 1, **i32),
               page_indices=src_table, dsa_cache_seqlens=torch.arange(rows, **i32),
               dsa_cu_seqlens_k=torch.arange(rows + 1, **i32))
    dst = dict(cache_seqlens=torch.zeros(rows, **i32), cu_seqlens_k=torch.zeros(rows + 1, **i32),
               page_table_1=dst_table, dsa_cache_seqlens=torch.zeros(rows, **i32),
               dsa_cu_seqlens_k=torch.zeros(rows + 1, **i32))
    assert rows * (width + 5) > 2**31
    pydsa.MetadataCopy(dst)(**src)
    torch.cuda.synchronize()
    for r in (0, 1, rows // 2, rows - 2, rows - 1):
        assert torch.equal(dst_table[r, :width], src_table[r])
        assert (dst_table[r, width:] == SENTINEL).all()


# ---------------------------------------------------------------------------------------------
# Errors, each naming the field


def _decode_case(device, **kw):
    return make_case(device, "decode", 4, 16, 0, kw.get("real"), kw.get("meta"), kw.get("k", 1), 1, 0)


def test_two_to_the_31_tiles_are_refused_before_anything_is_touched():
    """A launch holds fewer than 2^31 tiles, each at least one row: a copy of 2^31 page-table rows
    is refused through the C ABI with the field named, before any element is read or written (the
    buffers behind the pointers are four elements long)."""
    rows = 2**31
    buf = torch.arange(4, dtype=torch.int32)
    before = buf.clone()
    addr = buf.data_ptr()
    p = c_structs.new(c_structs.MetadataCopyParams)
    p.device, p.mode, p.bs, p.page_rows, p.page_width = _abi.DEVICE_HOST, _abi.MODE_DECODE, rows, rows, 1
    for name in ("cache_seqlens", "cu_seqlens_k", "page_indices", "dsa_cache_seqlens", "dsa_cu_seqlens_k"):
        setattr(p.src, name, addr)
    d = c_structs.MetadataDestination()
    for name in ("cache_seqlens", "cu_seqlens_k", "page_table", "dsa_cache_seqlens", "dsa_cu_seqlens_k"):
        setattr(d, name, addr)
    d.cache_seqlens_len = d.dsa_cache_seqlens_len = rows
    d.cu_seqlens_k_len = d.dsa_cu_seqlens_k_len = rows + 1
    d.page_table_rows, d.page_table_cols, d.page_table_stride = rows, 1, 1
    p.num_destinations, p.destinations = 1, ctypes.addressof(d)
    assert _abi.lib.dsa_metadata_copy(ctypes.byref(p), None) == 1
    assert "page_table is too large to copy in one launch" in _abi.lib.dsa_last_error().decode()
    assert torch.equal(buf, before)


def test_wrong_dtype_is_named(device):
    src, dsts = _decode_case(device)
    src["page_indices"] = src["page_indices"].long()
    with pytest.raises(TypeError, match="page_indices must have dtype torch.int32"):
        pydsa.MetadataCopy(dsts)(**src)
    dsts[0]["cache_seqlens"] = dsts[0]["cache_seqlens"].float()
    with pytest.raises(TypeError, match=r"destinations\[0\]\['cache_seqlens'\] must have dtype torch.int32"):
        pydsa.MetadataCopy(dsts)


def test_source_wider_than_destination_is_refused_before_anything_runs(device):
    src, dsts = make_case(device, "decode", 4, 16, 0, None, None, 2, 0, 0)
    dsts[1]["page_table_1"] = torch.full((4, 15), SENTINEL, dtype=torch.int32, device=device)
    before = [{k: t.clone() for k, t in d.items()} for d in dsts]
    with pytest.raises(pydsa.DsaError, match=r"destinations\[1\].page_table columns holds 15 elements but 16"):
        pydsa.MetadataCopy(dsts)(**src)
    assert all(torch.equal(d[k], b[k]) for d, b in zip(dsts, before) for k in d)
    src, dsts = make_case(device, "decode", 4, 16, 0, None, None, 1, 0, 0)
    dsts[0]["cu_seqlens_k"] = dsts[0]["cu_seqlens_k"][:4]
    with pytest.raises(pydsa.DsaError, match=r"cu_seqlens_k holds 4 elements but 5"):
        pydsa.MetadataCopy(dsts)(**src)


def test_partial_optional_group_is_refused(device):
    src, dsts = _decode_case(device, meta=10)
    del src["flashmla_metadata"]
    with pytest.raises(ValueError, match="FlashMLA group is all-or-nothing"):
        pydsa.MetadataCopy(dsts)(**src)
    src, dsts = _decode_case(device, meta=10)
    del dsts[0]["flashmla_metadata"]
    with pytest.raises(ValueError, match="FlashMLA group needs both"):
        pydsa.MetadataCopy(dsts)
    src, dsts = _decode_case(device, real=5, k=2)
    del dsts[1]["real_page_table"]
    with pytest.raises(ValueError, match="present in some destinations"):
        pydsa.MetadataCopy(dsts)


def test_missing_seqlens_expanded_in_verify_modes(device):
    for mode in ("target_verify", "draft_extend"):
        src, dsts = make_case(device, mode, 4, 16, 8, None, None, 1, 0, 0)
        del src["seqlens_expanded"]
        with pytest.raises(ValueError, match="seqlens_expanded: is required"):
            pydsa.MetadataCopy(dsts, mode=mode)(**src)
        del dsts[0]["seqlens_expanded"]
        with pytest.raises(ValueError, match=r"\['seqlens_expanded'\]: required"):
            pydsa.MetadataCopy(dsts, mode=mode)


def test_a_refused_destination_is_an_argument_error_naming_it(device):
    """Each check of the destination dicts raises pydsa.ArgumentValueError (a ValueError) whose argument is the
    destination or the entry of it that is wrong, as the message names it."""
    cases = []
    _, dsts = _decode_case(device)
    dsts[0]["page_table"] = dsts[0]["page_table_1"]  # a misspelled key
    cases.append((dsts, "decode", "destinations[0]", "unknown keys ['page_table']"))
    _, dsts = make_case(device, "target_verify", 4, 16, 8, None, None, 1, 0, 0)
    del dsts[0]["seqlens_expanded"]
    cases.append((dsts, "target_verify", "destinations[0]['seqlens_expanded']", "required in mode"))
    _, dsts = _decode_case(device, meta=10)
    del dsts[0]["flashmla_metadata"]
    cases.append((dsts, "decode", "destinations[0]", "the FlashMLA group needs both"))
    _, dsts = _decode_case(device, real=5, k=2)
    del dsts[1]["real_page_table"]
    cases.append((dsts, "decode", "destinations[1]['real_page_table']", "present in some destinations"))
    for dsts, mode, argument, said in cases:
        with pytest.raises(pydsa.ArgumentValueError) as caught:
            pydsa.MetadataCopy(dsts, mode=mode)
        assert caught.value.argument == argument and isinstance(caught.value, ValueError)
        assert str(caught.value).startswith(f"{argument}: ") and said in str(caught.value), str(caught.value)


def test_inconsistent_sizes_and_bad_mode_and_k(device):
    src, dsts = _decode_case(device)
    src["cu_seqlens_k"] = src["cu_seqlens_k"][:3]
    with pytest.raises(ValueError, match="cu_seqlens_k: expected 5 elements"):
        pydsa.MetadataCopy(dsts)(**src)
    with pytest.raises(ValueError, match="mode must be one of"):
        pydsa.MetadataCopy(dsts, mode="prefill")
    with pytest.raises(ValueError, match="expected 1..8 backends"):
        pydsa.MetadataCopy(dsts * 9)
    src, dsts = _decode_case(device)
    src["page_indices"] = src["page_indices"][:, ::2]
    with pytest.raises(ValueError, match="page_indices must be contiguous"):
        pydsa.MetadataCopy(dsts)(**src)


@gpu
@pytest.mark.gpu
def test_mismatched_devices_are_refused():
    src, dsts = _decode_case(torch.device("cuda"))
    src["cache_seqlens"] = src["cache_seqlens"].cpu()
    with pytest.raises(ValueError, match="cache_seqlens is on cpu but the other tensors are on cuda"):
        pydsa.MetadataCopy(dsts)(**src)
    src, dsts = _decode_case(torch.device("cuda"))
    dsts[0]["page_table_1"] = dsts[0]["page_table_1"].cpu()
    with pytest.raises(ValueError, match="is on cpu but"):
        pydsa.MetadataCopy(dsts)


def test_one_shot_function(device):
    src, dsts = make_case(device, "target_verify", 5, 33, 11, 7, 20, 2, 1, 4)
    want = [{k: t.clone() for k, t in d.items()} for d in dsts]
    for w in want:
        metadata_copy_reference(src, w, "target_verify")
    pydsa.metadata_copy(src, dsts, mode="target_verify")
    for got, ref in zip(dsts, want):
        assert all(torch.equal(got[k], ref[k]) for k in ref)


def test_bound_sources_and_launch(device):
    """bind() checks static sources once; launch() copies their current contents."""
    src, dsts = make_case(device, "draft_extend", 6, 40, 9, 3, 12, 2, 1, 8)
    copy = pydsa.MetadataCopy(dsts, mode="draft_extend").bind(**src)
    refill_and_check(src, dsts, "draft_extend", copy.launch)
    with pytest.raises(RuntimeError, match="no sources bound"):
        pydsa.MetadataCopy(dsts, mode="draft_extend").launch()
