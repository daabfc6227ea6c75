"""Prefill planner (docs/spec.md, the plan): every invariant as a hypothesis property, graph mode, errors, and
Cython planner == C planner (through ctypes) == the reference planner, record for record."""
import numpy as np
import pytest
import torch
from hypothesis import given, strategies as st

import pydsa
from pydsa.c128 import plan_prefill_c  # the library's C planner, beside pyplan's
import pyplan
from reference import CHUNK, SENTINEL, plan_reference, records

AWKWARD = [1, 17, 97, 127, 128, 129, 255, 256, 257]
lengths = st.one_of(st.sampled_from(AWKWARD), st.integers(1, 600), st.integers(1, 9000))
prefixes = st.one_of(st.just(0), st.sampled_from(AWKWARD), st.integers(0, 1000), st.integers(0, 100_000))


@st.composite
def batches(draw, max_b=24):
    reqs = draw(st.lists(st.tuples(prefixes, lengths), min_size=0, max_size=max_b))
    seq = np.array([p + e for p, e in reqs], np.int64)
    ext = np.array([e for _, e in reqs], np.int64)
    return seq, ext


def _by_request(seq, ext, compress, write):
    per = {b: [] for b in range(len(seq))}
    for kind, recs in (("c", compress), ("w", write)):
        for r in records(recs):
            per[r[1]].append((kind,) + r)
    return per


@given(batches())
def test_segments_cover_each_request_exactly_in_order(batch):
    """Invariant 1: a request's segments are disjoint, contiguous, in position order and cover
    [prefix, seq_len) exactly."""
    seq, ext = batch
    compress, write = pyplan.plan_prefill(seq, ext)
    for b, segs in _by_request(seq, ext, compress, write).items():
        segs.sort(key=lambda s: s[3])
        expect = int(seq[b] - ext[b])
        for _, _, _, pos, win in segs:
            assert pos - win + 1 == expect
            expect = pos + 1
        assert expect == seq[b]


@given(batches())
def test_no_segment_crosses_a_chunk_and_window_bounds_hold(batch):
    """Invariant 2: 1 <= window_len <= 128 and window_len <= position mod 128 + 1."""
    seq, ext = batch
    compress, write = pyplan.plan_prefill(seq, ext)
    for r in records(compress) + records(write):
        _, _, pos, win = r
        assert 1 <= win <= CHUNK
        assert win <= pos % CHUNK + 1


@given(batches())
def test_compress_closes_a_chunk_and_write_is_the_trailing_partial(batch):
    """Invariant 3: compress position mod 128 == 127; write position mod 128 < 127 and
    position == seq_len - 1."""
    seq, ext = batch
    compress, write = pyplan.plan_prefill(seq, ext)
    assert all(r[2] % CHUNK == CHUNK - 1 for r in records(compress))
    for _, b, pos, _ in records(write):
        assert pos % CHUNK < CHUNK - 1 and pos == seq[b] - 1


@given(batches())
def test_segment_counts_per_request(batch):
    """Invariant 4: compress count == floor(seq/128) - floor(prefix/128); write count ==
    (seq mod 128 != 0)."""
    seq, ext = batch
    compress, write = pyplan.plan_prefill(seq, ext)
    for b in range(len(seq)):
        assert (compress["batch_id"] == b).sum() == seq[b] // CHUNK - (seq[b] - ext[b]) // CHUNK
        assert (write["batch_id"] == b).sum() == int(seq[b] % CHUNK != 0)


@given(batches())
def test_ragged_rows_follow_request_offsets_and_lists_are_ordered(batch):
    """Invariant 5: ragged_id - (position - prefix) == off_b; lists ordered by (batch, position)."""
    seq, ext = batch
    offsets = np.concatenate([[0], np.cumsum(ext)[:-1]]) if len(ext) else []
    compress, write = pyplan.plan_prefill(seq, ext)
    for recs in (records(compress), records(write)):
        for rid, b, pos, _ in recs:
            assert rid - (pos - (seq[b] - ext[b])) == offsets[b]
        keys = [(b, pos) for _, b, pos, _ in recs]
        assert keys == sorted(keys)


@given(batches())
def test_windows_sum_to_the_tokens(batch):
    """Invariant 6: sum of window_len over both lists == sum of extend_lens."""
    seq, ext = batch
    compress, write = pyplan.plan_prefill(seq, ext)
    assert int(compress["window_len"].sum()) + int(write["window_len"].sum()) == int(ext.sum())


@given(batches())
def test_cython_c_and_reference_planners_agree(batch):
    """Differential: the Cython planner, the C planner through ctypes and the reference give the
    same records in the same order."""
    seq, ext = batch
    want_c, want_w = plan_reference(seq.tolist(), ext.tolist())
    got_c, got_w = pyplan.plan_prefill(seq, ext)
    c_c, c_w, nc, nw = plan_prefill_c(seq, ext)
    assert records(got_c) == want_c == records(c_c)
    assert records(got_w) == want_w == records(c_w)
    assert (nc, nw) == (len(want_c), len(want_w))


@given(batches(), st.integers(0, 5000))
def test_graph_mode_pads_with_sentinels_and_matches_plain(batch, padding):
    """Graph mode: the real records first, then sentinels up to the capacity, for a token count
    above the real sum; capacity sum/128 + B suffices; C and Cython agree."""
    seq, ext = batch
    tokens = int(ext.sum()) + padding
    c, w, nc, nw = pyplan.plan_prefill(seq, ext, num_tokens=tokens, graph=True, return_counts=True)
    assert len(c) == pyplan.compress_capacity(tokens, len(seq)) and len(w) == len(seq)
    want_c, want_w = plan_reference(seq.tolist(), ext.tolist())
    assert records(c[:nc]) == want_c and records(w[:nw]) == want_w
    assert all(r == SENTINEL for r in records(c[nc:]) + records(w[nw:]))
    cc, cw, _, _ = plan_prefill_c(seq, ext, num_tokens=tokens, graph=True)
    assert records(cc) == records(c) and records(cw) == records(w)


@given(batches())
def test_capacity_bound_is_enough_and_tight_buffers_work(batch):
    """Plans sized by sum(extend)/128 + B compress and B write records always fit; caller-owned
    buffers (numpy and torch) are written in place without allocation."""
    seq, ext = batch
    nb = len(seq)
    cap = pyplan.compress_capacity(int(ext.sum()), nb)
    out_c = np.zeros(cap, pyplan.SEGMENT_DTYPE)
    out_w = torch.zeros((nb, 4), dtype=torch.int32)
    c, w, nc, nw = pyplan.plan_prefill(seq, ext, out=(out_c, out_w), return_counts=True)
    assert nc == 0 or np.shares_memory(c, out_c)
    assert records(c) == records(out_c[:nc])
    assert records(w) == [tuple(x & 0xFFFFFFFF for x in row) for row in out_w[:nw].tolist()]


def test_inputs_may_be_lists_int32_and_torch():
    want = plan_reference([300, 50], [200, 50])
    for seq, ext in (([300, 50], [200, 50]), (np.array([300, 50], np.int32), np.array([200, 50], np.int32)),
                     (torch.tensor([300, 50]), torch.tensor([200, 50]))):
        c, w = pyplan.plan_prefill(seq, ext)
        assert (records(c), records(w)) == want


def test_empty_batch():
    c, w = pyplan.plan_prefill(np.zeros(0, np.int64), np.zeros(0, np.int64))
    assert len(c) == 0 and len(w) == 0


@pytest.mark.parametrize("seq,ext,message", [
    ([10], [0], r"extend_lens\[0\] is 0"),
    ([10, 10], [5, 11], r"extend_lens\[1\] is 11"),
    ([10], [-1], r"extend_lens\[0\] is -1"),
    ([-5], [1], r"seq_lens\[0\] is -5"),
    ([10, 4], [5], "extend_lens has 1 entries but seq_lens has 2"),
    ([1 << 33], [1], r"seq_lens\[0\]"),
])
def test_bad_input_names_argument_and_request(seq, ext, message):
    with pytest.raises(ValueError, match=message):
        pyplan.plan_prefill(np.array(seq, np.int64), np.array(ext, np.int64))
    if len(seq) == len(ext):
        with pytest.raises(pydsa.DsaError):
            plan_prefill_c(seq, ext)


def test_token_count_must_match_in_plain_mode_and_cover_in_graph_mode():
    with pytest.raises(ValueError, match="must be equal"):
        pyplan.plan_prefill([300], [200], num_tokens=201)
    with pytest.raises(ValueError, match="graph mode needs >="):
        pyplan.plan_prefill([300], [200], num_tokens=199, graph=True)
    with pytest.raises(ValueError, match="num_tokens is required"):
        pyplan.plan_prefill([300], [200], graph=True)
    with pytest.raises(pydsa.DsaError, match="num_tokens"):
        plan_prefill_c([300], [200], num_tokens=201)


def test_too_small_capacity_is_an_error_and_nothing_is_written():
    out_c = np.zeros(1, pyplan.SEGMENT_DTYPE)
    out_w = np.zeros(1, pyplan.SEGMENT_DTYPE)
    with pytest.raises(ValueError, match="needs 2 compress records"):
        pyplan.plan_prefill([300], [200], out=(out_c, out_w))
    assert records(out_c) == [(0, 0, 0, 0)] and records(out_w) == [(0, 0, 0, 0)]
    with pytest.raises(pydsa.DsaError, match="compress_capacity is 1"):
        plan_prefill_c([300], [200], capacity=(1, 1))
    with pytest.raises(ValueError, match="whole 16-byte records"):
        pyplan.plan_prefill([300], [200], out=(np.zeros(5, np.uint32), out_w))
