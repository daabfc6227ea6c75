"""The c4 plans (docs/spec.md, "c4 plans"): the plan op writes, on either backend and into whatever the output
held before, exactly the records of the torch planners pydsa.sglang used before it (tests/c4_plan_reference.py),
on tables whose values are untrusted: request rows, positions and tokens outside the tables, negative state
slots, state slots whose rows do not fit 31 bits, lengths <= 0 and past the table, extends longer than the
sequence, extends cut short by num_q_tokens."""
from __future__ import annotations

import ctypes

import numpy as np
import pytest
import torch
from hypothesis import given, settings, strategies as st

import c4_plan_reference as ref
import c_structs
from conftest import DEVICES, examples
from pydsa import _abi, _fill_c4_plan
from pydsa.sglang import c4 as sglang_c4

AWKWARD_B = [1, 17, 127, 257]
# (swa_page_size, ring_size): sglang's rings of 8 and 16 rows per 256-token page, a small page, and sizes that are
# not powers of two (the plans divide by them: a shift and a mask only for powers of two)
RINGS = [(256, 8), (256, 16), (64, 4), (96, 12)]
POISON = 0xAB


def _tables(g: torch.Generator, b: int, width: int):
    """Untrusted tables: req_to_token [rows, width] whose rows lie apart (a view of a wider table) with tokens
    past full_to_state and negative ones; full_to_state with negative slots, a few past 2^33 (64-bit slot
    arithmetic) and past 2^40 (rows past a record's 31 bits); request rows of b requests outside the table and
    negative."""
    rows = max(4, b // 2 + 3)
    num_full = rows * width // 2 + 50
    wide = torch.randint(-4, num_full + 6, (rows, width + 5), generator=g, dtype=torch.int64).to(torch.int32)
    f2s = torch.randint(-3, 4 * num_full, (num_full,), generator=g, dtype=torch.int64)
    f2s[torch.randint(0, num_full, (8,), generator=g)] += 2 ** 33
    f2s[torch.randint(0, num_full, (4,), generator=g)] += 2 ** 40
    rid = torch.randint(-3, rows + 3, (b,), generator=g, dtype=torch.int64)
    return rid, wide[:, :width], f2s


def _lengths(values: torch.Tensor, int32: bool, device) -> torch.Tensor:
    return values.to(torch.int32 if int32 else torch.int64).to(device)


def _poisoned(rows: int, width: int, device) -> torch.Tensor:
    return torch.full((rows, width), POISON, dtype=torch.uint8, device=device)


def _on(device, *tensors):
    return [t.to(device) for t in tensors]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("b", AWKWARD_B)
@settings(max_examples=examples(8))
@given(seed=st.integers(0, 2 ** 31 - 1), ring=st.sampled_from(RINGS), use_req_ring=st.booleans(),
       int32=st.booleans())
def test_decode_records_equal_the_torch_planners_on_untrusted_tables(device, b, seed, ring, use_req_ring, int32):
    """plan_d from pydsa.sglang.c4.plan_decode and from the op into a poisoned plan_d: byte for byte the torch
    planner's, -1 rows wherever the tables address none."""
    g = torch.Generator().manual_seed(seed)
    width = int(torch.randint(1, 600, (1,), generator=g))
    rid, r2t, f2s = _tables(g, b, width)
    seq = torch.randint(-3, width + 12, (b,), generator=g)
    page, size = ring
    want = ref.plan_decode(rid, r2t, f2s, seq, page, size, use_req_ring)
    d_rid, d_r2t, d_f2s = _on(device, rid, r2t, f2s)
    d_seq = _lengths(seq, int32, device)
    if size < 8:  # the op plans any ring; pydsa.sglang refuses rings its kernels would corrupt
        with pytest.raises(RuntimeError, match="ring_size is 4; expected a multiple of 4, >= 8"):
            sglang_c4.plan_decode(d_rid, d_r2t, d_f2s, d_seq, page, size, use_req_ring)
    else:
        got = sglang_c4.plan_decode(d_rid, d_r2t, d_f2s, d_seq, page, size, use_req_ring)
        assert torch.equal(got.cpu(), want)
    plan_d = _poisoned(b, 16, device)
    assert _fill_c4_plan.decode_plan(d_rid, d_r2t, d_f2s, d_seq, swa_page_size=page, ring_size=size,
                                     use_req_ring=use_req_ring, plan_d=plan_d) == 0
    assert torch.equal(plan_d.cpu(), want)


@pytest.mark.parametrize("device", DEVICES)
def test_a_decode_length_past_31_bits_is_a_record_the_ops_count(device):
    """The op's record of a length past 2^31 - 1 is {2^31 - 1, -1, -1, -1} (the ops skip and count it), never its low
    32 bits (2^40 would be a padding record nothing counts, 2^32 + 8 a real length of 8)."""
    g = torch.Generator().manual_seed(3)
    rid, r2t, f2s = _tables(g, 5, 64)
    seq = torch.tensor([4, 2 ** 40, 2 ** 31, 2 ** 32 + 8, 2 ** 31 - 1])
    for use_req_ring in (False, True):
        want = ref.plan_decode(rid, r2t, f2s, seq, 256, 16, use_req_ring)
        words = want.view(torch.int32).reshape(-1, 4).tolist()
        assert words[1] == words[2] == words[3] == [2 ** 31 - 1, -1, -1, -1], words
        plan_d = _poisoned(5, 16, device)
        d_rid, d_r2t, d_f2s, d_seq = _on(device, rid, r2t, f2s, seq)
        assert _fill_c4_plan.decode_plan(d_rid, d_r2t, d_f2s, d_seq, swa_page_size=256, ring_size=16,
                                         use_req_ring=use_req_ring, plan_d=plan_d) == 0
        assert torch.equal(plan_d.cpu(), want)


@pytest.mark.parametrize("device", DEVICES)
def test_ring_rows_past_31_bits_are_records_the_ops_count_never_another_requests_rows(device):
    """A request row whose ring rows lie past 2^31 - 1 (rid 2^29 of a request-scoped ring of 8 rows: row 2^32 + p,
    whose low 32 bits are request 0's row p; rid 2^61 + 1, whose product wraps 64 bits to request 1's rows) or a
    state slot past them (2^40 in a page-scoped ring) gives -1 rows and groups, which the ops skip and count, in the
    decode and the extend records alike."""
    r2t = torch.arange(64, dtype=torch.int32).reshape(1, 64)
    f2s = torch.full((64,), 2 ** 40 + 5, dtype=torch.int64)
    seq, ext = torch.tensor([16, 16]), torch.tensor([8, 8])
    for use_req_ring, rid in ((True, torch.tensor([2 ** 29, 2 ** 61 + 1])), (False, torch.tensor([0, 0]))):
        d_rid, d_r2t, d_f2s, d_seq, d_ext = _on(device, rid, r2t, f2s, seq, ext)
        plan_d = _poisoned(2, 16, device)
        assert _fill_c4_plan.decode_plan(d_rid, d_r2t, d_f2s, d_seq, swa_page_size=256, ring_size=8,
                                         use_req_ring=use_req_ring, plan_d=plan_d) == 0
        assert plan_d.cpu().view(torch.int32).reshape(-1, 4).tolist() == [[16, -1, -1, -1]] * 2
        plan_c, plan_w = _poisoned(16, 16, device), _poisoned(16, 8, device)
        assert _fill_c4_plan.extend_plan(d_rid, d_seq, d_ext, d_r2t, d_f2s, swa_page_size=256, ring_size=8,
                                         use_req_ring=use_req_ring, plan_c=plan_c, plan_w=plan_w) == 0
        words_c = plan_c.cpu().view(torch.int32).reshape(-1, 4).tolist()
        words_w = plan_w.cpu().view(torch.int32).reshape(-1, 2).tolist()
        assert [w[2:] for w in words_c if w[0] != -1 and w[1] >> 16] == [[-1, -1]] * 2, words_c
        assert [w[1] for w in words_w if w[0] != -1] == [-1] * len([w for w in words_w if w[0] != -1]), words_w
        assert any(w[0] != -1 for w in words_w)
        want = ref.plan_prefill(rid, seq, ext, r2t, f2s, 256, 8, 16, True, use_req_ring, host=False)
        assert torch.equal(plan_c.cpu(), want[0]) and torch.equal(plan_w.cpu(), want[1])


def _extends(g: torch.Generator, b: int, width: int, short: bool):
    """Extend lengths 0..12 (zeros among them) after prefixes from -4 (extends longer than the sequence: negative
    positions) to past the table, and num_q_tokens >= B: a padded bucket, or (short) fewer rows than the extends."""
    ext = torch.randint(0, 13, (b,), generator=g)
    ext[torch.rand(b, generator=g) < 0.2] = 0
    seq = ext + torch.randint(-4, width + 8, (b,), generator=g)
    total = int(ext.sum())
    n = max(b, total - int(torch.randint(0, total // 2 + 1, (1,), generator=g))) if short else \
        max(b, total + int(torch.randint(0, 40, (1,), generator=g)))
    return seq, ext, min(n, 65536)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("b", AWKWARD_B)
@settings(max_examples=examples(8))
@given(seed=st.integers(0, 2 ** 31 - 1), ring=st.sampled_from(RINGS), use_req_ring=st.booleans(),
       int32=st.booleans(), short=st.booleans())
def test_extend_records_from_device_lengths_equal_the_torch_planners(device, b, seed, ring, use_req_ring, int32,
                                                                     short):
    """plan_c and plan_w of lengths on the tables' device (CUDA graphs, target verify), written by the op into
    poisoned tensors (and, on the GPU, through pydsa.sglang.c4.plan_prefill): the torch device planner's records,
    in request and position order, each list padded to num_q_tokens rows."""
    g = torch.Generator().manual_seed(seed)
    width = int(torch.randint(1, 400, (1,), generator=g))
    rid, r2t, f2s = _tables(g, b, width)
    seq, ext, n = _extends(g, b, width, short)
    page, size = ring
    want_c, want_w = ref.plan_prefill(rid, seq, ext, r2t, f2s, page, size, n, True, use_req_ring, host=False)
    d_rid, d_r2t, d_f2s = _on(device, rid, r2t, f2s)
    d_seq, d_ext = _lengths(seq, int32, device), _lengths(ext, not int32, device)
    plan_c, plan_w = _poisoned(n, 16, device), _poisoned(n, 8, device)
    assert _fill_c4_plan.extend_plan(d_rid, d_seq, d_ext, d_r2t, d_f2s, swa_page_size=page, ring_size=size,
                                     use_req_ring=use_req_ring, plan_c=plan_c, plan_w=plan_w) == 0
    assert torch.equal(plan_c.cpu(), want_c) and torch.equal(plan_w.cpu(), want_w)
    if torch.device(device).type == "cuda" and size >= 8:  # pydsa.sglang refuses smaller rings (test_careless_sglang)
        got_c, got_w = sglang_c4.plan_prefill(d_rid, d_seq, d_ext, d_r2t, d_f2s, page, size, n, use_cuda_graph=True,
                                              use_req_ring=use_req_ring)
        assert torch.equal(got_c.cpu(), want_c) and torch.equal(got_w.cpu(), want_w)


@pytest.mark.parametrize("device", DEVICES)
@settings(max_examples=examples(12))
@given(seed=st.integers(0, 2 ** 31 - 1), ring=st.sampled_from(RINGS + [(5, 16), (3, 8), (1, 8)]),
       use_req_ring=st.booleans(), b=st.sampled_from([1, 6, 17]))
def test_extend_records_of_positions_that_wrap_64_bits_equal_the_torch_planners(device, seed, ring, use_req_ring, b):
    """Lengths near -2^63 and 2^63 - 1 (positions seq - extend + j that wrap past 2^63 - 1, first kept positions that
    wrap), small pages (every position a page's last four) and a cut-short num_q_tokens: the op numbers its records
    from closed-form counts of each request's rows, and those are the torch planner's records, row by row."""
    g = torch.Generator().manual_seed(seed)
    rid, r2t, f2s = _tables(g, b, 64)
    ext = torch.randint(-3, 40, (b,), generator=g)
    edge = torch.randint(0, 60, (b,), generator=g)
    kind = torch.randint(0, 3, (b,), generator=g)
    seq = torch.where(kind == 0, (2 ** 63 - 1) - edge, torch.where(kind == 1, -(2 ** 63) + edge, edge))
    total = int(ext.clamp_min(0).sum())
    n = max(b, total + int(torch.randint(-total // 2, 9, (1,), generator=g)))
    page, size = ring
    # (a negative extend covers no row: test_a_negative_extend_covers_no_row)
    want_c, want_w = ref.plan_prefill(rid, seq, ext.clamp_min(0), r2t, f2s, page, size, n, True, use_req_ring,
                                      host=False)
    plan_c, plan_w = _poisoned(n, 16, device), _poisoned(n, 8, device)
    assert _fill_c4_plan.extend_plan(*_on(device, rid, seq, ext, r2t, f2s), swa_page_size=page, ring_size=size,
                                     use_req_ring=use_req_ring, plan_c=plan_c, plan_w=plan_w) == 0
    assert torch.equal(plan_c.cpu(), want_c) and torch.equal(plan_w.cpu(), want_w)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("b", [1025, 2100])
def test_extend_records_of_more_requests_than_one_pass_holds_equal_the_torch_planners(device, b):
    """Over 1024 requests (the op takes their ends 1024 at a time), zero extends at the joins: the same records."""
    g = torch.Generator().manual_seed(b)
    rid, r2t, f2s = _tables(g, b, 300)
    ext = torch.randint(0, 5, (b,), generator=g)
    ext[1000:1100] = 0
    seq = ext + torch.randint(0, 290, (b,), generator=g)
    n = int(ext.sum()) + 7
    for use_req_ring in (False, True):
        want_c, want_w = ref.plan_prefill(rid, seq, ext, r2t, f2s, 256, 16, n, True, use_req_ring, host=False)
        plan_c, plan_w = _poisoned(n, 16, device), _poisoned(n, 8, device)
        d = _on(device, rid, seq, ext, r2t, f2s)
        assert _fill_c4_plan.extend_plan(*d, swa_page_size=256, ring_size=16, use_req_ring=use_req_ring,
                                         plan_c=plan_c, plan_w=plan_w) == 0
        assert torch.equal(plan_c.cpu(), want_c) and torch.equal(plan_w.cpu(), want_w)


@pytest.mark.parametrize("device", DEVICES)
def test_the_longest_extend_fills_every_16_bit_ragged_row(device):
    """65,536 rows (3 requests, one of them past 32K tokens): every ragged row's records, in order."""
    g = torch.Generator().manual_seed(7)
    rid, r2t, f2s = torch.tensor([0, 2, 1]), torch.arange(3 * 40000, dtype=torch.int32).reshape(3, 40000), \
        torch.randint(0, 10 ** 6, (3 * 40000,), generator=g)
    ext = torch.tensor([20000, 35000, 10536])
    seq = ext + torch.tensor([3, 1000, 0])
    want_c, want_w = ref.plan_prefill(rid, seq, ext, r2t, f2s, 256, 8, 65536, True, False, host=False)
    plan_c, plan_w = _poisoned(65536, 16, device), _poisoned(65536, 8, device)
    assert _fill_c4_plan.extend_plan(*_on(device, rid, seq, ext, r2t, f2s), swa_page_size=256, ring_size=8,
                                     use_req_ring=False, plan_c=plan_c, plan_w=plan_w) == 0
    assert torch.equal(plan_c.cpu(), want_c) and torch.equal(plan_w.cpu(), want_w)


@pytest.mark.parametrize("device", DEVICES)
def test_a_negative_extend_covers_no_row(device):
    """A negative extend length (the torch planner's rows were unspecified there: a search over an unsorted
    cumulative sum) covers no ragged row: the records of the same lengths with it 0."""
    g = torch.Generator().manual_seed(3)
    rid, r2t, f2s = _tables(g, 17, 200)
    seq, ext, n = _extends(g, 17, 200, False)
    ext[[2, 9]] = torch.tensor([-5, -1])
    want_c, want_w = ref.plan_prefill(rid, seq, ext.clamp_min(0), r2t, f2s, 256, 8, n, True, False, host=False)
    plan_c, plan_w = _poisoned(n, 16, device), _poisoned(n, 8, device)
    assert _fill_c4_plan.extend_plan(*_on(device, rid, seq, ext, r2t, f2s), swa_page_size=256, ring_size=8,
                                     use_req_ring=False, plan_c=plan_c, plan_w=plan_w) == 0
    assert torch.equal(plan_c.cpu(), want_c) and torch.equal(plan_w.cpu(), want_w)


@pytest.mark.parametrize("device", DEVICES)
@settings(max_examples=examples(10))
@given(seed=st.integers(0, 2 ** 31 - 1), ring=st.sampled_from(RINGS), use_req_ring=st.booleans(),
       graph=st.booleans(), b=st.sampled_from(AWKWARD_B))
def test_extend_records_from_host_lengths_equal_the_host_planners(device, seed, ring, use_req_ring, graph, b):
    """Host lengths (eager prefill, 1 <= extend <= seq, sum == num_q_tokens): pydsa.sglang.c4.plan_prefill's
    records are the host planner's, exactly its rows (padded to num_q_tokens in CUDA-graph mode)."""
    g = torch.Generator().manual_seed(seed)
    width = int(torch.randint(16, 700, (1,), generator=g))
    rid, r2t, f2s = _tables(g, b, width)
    ext = torch.randint(1, 40, (b,), generator=g)
    seq = ext + torch.randint(0, width, (b,), generator=g)
    n = int(ext.sum())
    page, size = ring
    want_c, want_w = ref.plan_prefill(rid, seq, ext, r2t, f2s, page, size, n, graph, use_req_ring, host=True)
    d_rid, d_r2t, d_f2s = _on(device, rid, r2t, f2s)
    if size < 8:  # pydsa.sglang refuses rings its kernels would corrupt
        with pytest.raises(RuntimeError, match="ring_size is 4; expected a multiple of 4, >= 8"):
            sglang_c4.plan_prefill(d_rid, seq, ext, d_r2t, d_f2s, page, size, n, use_cuda_graph=graph,
                                   use_req_ring=use_req_ring)
        return
    got_c, got_w = sglang_c4.plan_prefill(d_rid, seq, ext, d_r2t, d_f2s, page, size, n, use_cuda_graph=graph,
                                          use_req_ring=use_req_ring)
    assert torch.equal(got_c.cpu(), want_c) and torch.equal(got_w.cpu(), want_w)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_a_captured_plan_replays_with_the_lengths_of_replay_time():
    """CUDA graphs: the decode plan and a device-length extend plan captured once; new lengths written into the
    same tensors before each replay give the torch planners' records of those lengths."""
    g = torch.Generator().manual_seed(11)
    b, v = 33, 4
    rid, r2t, f2s = _tables(g, b, 500)
    d_rid, d_r2t, d_f2s = _on("cuda", rid, r2t, f2s)
    d_seq, d_ext = torch.ones(b, dtype=torch.int64, device="cuda"), torch.full((b,), v, device="cuda")
    plan_d, plan_c, plan_w = _poisoned(b, 16, "cuda"), _poisoned(b * v, 16, "cuda"), _poisoned(b * v, 8, "cuda")

    def step():
        _fill_c4_plan.decode_plan(d_rid, d_r2t, d_f2s, d_seq, swa_page_size=256, ring_size=16, use_req_ring=False,
                                  plan_d=plan_d)
        _fill_c4_plan.extend_plan(d_rid, d_seq, d_ext, d_r2t, d_f2s, swa_page_size=256, ring_size=16,
                                  use_req_ring=False, plan_c=plan_c, plan_w=plan_w)
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        step()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    for _ in range(3):
        seq = torch.randint(-2, 520, (b,), generator=g)
        d_seq.copy_(seq)
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(plan_d.cpu(), ref.plan_decode(rid, r2t, f2s, seq, 256, 16))
        want_c, want_w = ref.plan_prefill(rid, seq, torch.full((b,), v), r2t, f2s, 256, 16, b * v, True, host=False)
        assert torch.equal(plan_c.cpu(), want_c) and torch.equal(plan_w.cpu(), want_w)


def test_the_op_refuses_what_it_cannot_read_by_name():
    """A C caller's wrong struct or fields fail the call naming them; the compiled call refuses tensors by name."""
    p = c_structs.new(c_structs.C4PlanParams)
    p.struct_size -= 8
    assert _abi.lib.dsa_c4_plan_decode(ctypes.byref(p), None) == 2
    assert f"expects {ctypes.sizeof(c_structs.C4PlanParams)}" in _abi.lib.dsa_last_error().decode()
    p = c_structs.new(c_structs.C4PlanParams)
    p.device, p.swa_page_size, p.ring_size = -1, 256, 0
    assert _abi.lib.dsa_c4_plan_extend(ctypes.byref(p), None) == 1
    assert "ring_size 0" in _abi.lib.dsa_last_error().decode()
    p.ring_size, p.batch_size = 8, 2
    assert _abi.lib.dsa_c4_plan_decode(ctypes.byref(p), None) == 1
    assert "req_pool_indices, seq_lens and plan_d must be non-null" in _abi.lib.dsa_last_error().decode()
    p.batch_size, p.num_tokens = 0, 70000
    assert _abi.lib.dsa_c4_plan_extend(ctypes.byref(p), None) == 1
    assert "num_tokens is 70000" in _abi.lib.dsa_last_error().decode()
    rid, r2t, f2s = torch.zeros(2, dtype=torch.int64), torch.zeros(2, 8, dtype=torch.int32), torch.zeros(4).long()
    seq = torch.ones(2, dtype=torch.int64)
    with pytest.raises(RuntimeError, match=r"^plan_d must be a contiguous uint8 tensor \[2, 16\] \(got uint8 \[3, 16"):
        _fill_c4_plan.decode_plan(rid, r2t, f2s, seq, swa_page_size=256, ring_size=8, use_req_ring=False,
                                  plan_d=torch.empty(3, 16, dtype=torch.uint8))
    with pytest.raises(RuntimeError, match=r"^seq_lens must be a contiguous 1-D int64 or int32 tensor"):
        _fill_c4_plan.decode_plan(rid, r2t, f2s, seq.float(), swa_page_size=256, ring_size=8, use_req_ring=False,
                                  plan_d=torch.empty(2, 16, dtype=torch.uint8))
    with pytest.raises(RuntimeError, match=r"^req_to_token's rows must be contiguous"):
        _fill_c4_plan.decode_plan(rid, torch.zeros(8, 2, dtype=torch.int32).t(), f2s, seq, swa_page_size=256,
                                  ring_size=8, use_req_ring=False, plan_d=torch.empty(2, 16, dtype=torch.uint8))
    with pytest.raises(RuntimeError, match=r"^plan_w must be a contiguous uint8 tensor \[4, 8\]"):
        _fill_c4_plan.extend_plan(rid, seq, seq, r2t, f2s, swa_page_size=256, ring_size=8, use_req_ring=False,
                                  plan_c=torch.empty(4, 16, dtype=torch.uint8),
                                  plan_w=torch.empty(5, 8, dtype=torch.uint8))


def test_the_host_counts_agree_with_the_records_on_page_ends():
    """The host path's record counts (closing positions; kept ones, page ends among them) on extends crossing
    several 256-token pages from prefixes just before a page end: the host planner's counts."""
    rng = np.random.default_rng(0)
    ext = torch.from_numpy(rng.integers(1, 900, 40))
    seq = ext + torch.from_numpy(256 * rng.integers(0, 4, 40) + rng.integers(250, 258, 40))
    rid, r2t = torch.arange(40), torch.arange(40 * 2000, dtype=torch.int32).reshape(40, 2000)
    f2s = torch.arange(40 * 2000)
    n = int(ext.sum())
    for ring_size, use_req_ring in ((8, False), (16, False), (16, True)):
        want_c, want_w = ref.plan_prefill(rid, seq, ext, r2t, f2s, 256, ring_size, n, False, use_req_ring)
        got_c, got_w = sglang_c4.plan_prefill(rid, seq, ext, r2t, f2s, 256, ring_size, n, use_req_ring=use_req_ring)
        assert got_c.shape == want_c.shape and got_w.shape == want_w.shape
        assert torch.equal(got_c, want_c) and torch.equal(got_w, want_w)
