"""Speculative decoding (docs/spec.md, speculative decoding): c128_verify, the bank, c128_commit.

The defining property: any schedule of prefills, decodes and verify steps with any acceptances leaves
the states and outputs equal, bit for bit on one backend, to running only the accepted tokens as plain
decodes, and within 1e-5 of float64 with fp32 state (bf16 state: the documented bound)."""
import numpy as np
import pytest
import torch
from hypothesis import given, settings, strategies as st

import pydsa
import pyplan
from conftest import DEVICES, HAS_GPU, examples, gpu
from reference import BF16_BOUND, CHUNK, compress_offline, rel_err
from test_store import entry_bytes

TOLERANCE = 1e-5


def _rows(rng, n, d):
    kv = rng.standard_normal((n, d), dtype=np.float32)
    score = (rng.standard_normal((n, d), dtype=np.float32) * 3).astype(np.float32)
    return np.concatenate([kv, score], axis=1)


class Worlds:
    """The same requests run two ways: speculatively (verify + commit, state read from `load`) and
    as plain decodes of the accepted tokens only (the reference world)."""

    def __init__(self, device, d, b, v, state_dtype, copying, seed, store=False):
        self.device, self.d, self.b, self.v, self.copying = device, d, b, v, copying
        self.rng = np.random.default_rng(seed)
        gen = torch.Generator().manual_seed(seed)
        i32 = dict(dtype=torch.int32, device=device)
        self.main = torch.arange(b, **i32)
        if copying:  # sglang's layout: entry j of request r at r + j * b, entry 0 the main slot
            self.bank, self.stride, slots = self.main.clone(), b, b * (v + 1)
        else:  # a bank of v + 1 slots per request after the main slots, in a shuffled order
            order = torch.randperm(b, generator=gen).to(torch.int32)
            self.bank, self.stride, slots = (b + order * (v + 1)).to(device), 1, b + b * (v + 1)
        stale = torch.randn(slots + 3, 1, 3 * d, generator=gen) * 50  # stale contents must never leak in
        self.spec = stale.to(state_dtype).to(device)
        self.ref = stale[:b].clone().to(state_dtype).to(device)
        self.load = self.main.clone()
        self.ape = torch.randn(CHUNK, d, generator=gen).to(device)
        self.seq = [0] * b
        self.history = [[] for _ in range(b)]  # accepted rows of each request, in order
        self.vectors = 0
        self.max_err = 0.0
        self.bound = TOLERANCE if state_dtype == torch.float32 else BF16_BOUND
        # With store: the speculative world's ops also store every vector they close into a paged
        # cache; each accepted chunk's entry must equal the standalone store of its vector.
        self.kv = self.scratch = None
        self.slot_of, self.next_slot, self.entries = {}, 0, 0
        if store:
            w = torch.rand(d, generator=gen) + 0.5
            angles = torch.rand(8192, 32, generator=gen) * 6.3
            rot = torch.stack([angles.cos(), angles.sin()], -1).reshape(8192, 64).to(device)
            page = pydsa.kv_page_bytes(d, 2)
            self.kv = pydsa.KVCache(torch.zeros(2048, page, dtype=torch.uint8, device=device), w.to(device), rot,
                                    page_size=2)
            self.scratch = pydsa.KVCache(torch.zeros(1, page, dtype=torch.uint8, device=device), w.to(device), rot,
                                         page_size=2)

    def _slot(self):
        self.next_slot = (self.next_slot + 1) % 4096
        return self.next_slot

    def _store_args(self, rows: int, closing: dict) -> dict:
        """store= and cache_slots= for an op of `rows` rows; closing: row -> (request, position)."""
        if self.kv is None:
            return {}
        slots = np.full(rows, -1, np.int64)
        for row, key in closing.items():
            slots[row] = self._slot()
            self.slot_of[key] = int(slots[row])
        return dict(store=self.kv, cache_slots=self._t(slots, torch.int64))

    def _check_entry(self, r, pos, vec):
        loc = self.slot_of.pop((r, pos), None)
        if loc is None:
            return
        d = self.d
        pydsa.kv_store(vec.reshape(1, d).contiguous(), self._t([pos - CHUNK + 1]), self._t([0], torch.int64),
                       self.scratch)
        data, scales = entry_bytes(self.kv.cache.cpu().numpy(), loc, d, 2)
        ref_data, ref_scales = entry_bytes(self.scratch.cache.cpu().numpy(), 0, d, 2)
        assert np.array_equal(data, ref_data), f"request {r} chunk ending at {pos}: cache entry differs"
        assert np.array_equal(scales, ref_scales), f"request {r} chunk ending at {pos}: scales differ"
        self.entries += 1

    def _t(self, x, dtype=torch.int32):
        return torch.as_tensor(np.ascontiguousarray(x), dtype=dtype).to(self.device)

    def _check_vector(self, r, pos, vec):
        """vec: the chunk vector emitted for request r's token at position pos (a chunk end)."""
        rows = np.asarray(self.history[r][pos - CHUNK + 1:pos + 1])
        ref = compress_offline(rows[:, :self.d], rows[:, self.d:], self.ape.cpu().numpy())
        err = rel_err(vec.cpu().numpy(), ref)
        self.max_err = max(self.max_err, err)
        self.vectors += 1
        assert err <= self.bound, f"request {r} chunk ending at {pos}: error {err:.2e} against float64"
        if self.kv is not None:
            self._check_entry(r, pos, vec)

    def prefill(self, extends):
        d = self.d
        seq = np.array([s + e for s, e in zip(self.seq, extends)], np.int64)
        ext = np.array(extends, np.int64)
        rows = _rows(self.rng, int(ext.sum()), d)
        plan = pyplan.plan_prefill(seq, ext)
        kv = self._t(rows, torch.float32)
        outs = [torch.full((len(rows), d), float("nan"), device=self.device) for _ in range(2)]
        closing, off = {}, 0
        for r, e in enumerate(extends):
            for i in range(e):
                if (self.seq[r] + i) % CHUNK == CHUNK - 1:
                    closing[off + i] = (r, self.seq[r] + i)
            off += e
        pydsa.c128_prefill(self.spec, kv, outs[0], self.ape, self.main, plan, load_indices=self.load,
                           **self._store_args(len(rows), closing))
        # A storing prefill takes a wide tile layout, and a prefill's sum order follows its layout
        # (docs/spec.md, prefill): the reference world's prefill stores too (every slot negative:
        # nothing is written) so that both worlds run the same arithmetic.
        ref_store = {} if self.kv is None else dict(
            store=self.scratch, cache_slots=self._t(np.full(len(rows), -1, np.int64), torch.int64))
        pydsa.c128_prefill(self.ref, kv, outs[1], self.ape, self.main, plan, **ref_store)
        assert torch.equal(outs[0].nan_to_num(7.0), outs[1].nan_to_num(7.0))
        self.load.copy_(self.main)
        off = 0
        for r, e in enumerate(extends):
            self.history[r].extend(rows[off:off + e])
            for i in range(e):
                if (self.seq[r] + i) % CHUNK == CHUNK - 1:
                    self._check_vector(r, self.seq[r] + i, outs[1][off + i])
            self.seq[r] += e
            off += e

    def _decode_ref(self, rows, live):
        """One plain decode of the reference world: rows [b, 2d], live[r] says who takes a token.
        Returns the output [b, d] (NaN where nothing was written)."""
        out = torch.full((self.b, self.d), float("nan"), device=self.device)
        seq = [s + 1 if ok else 0 for s, ok in zip(self.seq, live)]
        pydsa.c128_decode(self.ref, self._t(rows, torch.float32), out, self.ape, self.main, self._t(seq))
        for r, ok in enumerate(live):
            if ok:
                self.history[r].append(rows[r])
                if self.seq[r] % CHUNK == CHUNK - 1:
                    self._check_vector(r, self.seq[r], out[r])
                self.seq[r] += 1
        return out

    def decode(self):
        rows = _rows(self.rng, self.b, self.d)
        out = torch.full((self.b, self.d), float("nan"), device=self.device)
        seq = self._t([s + 1 for s in self.seq])
        closing = {r: (r, s) for r, s in enumerate(self.seq) if s % CHUNK == CHUNK - 1}
        pydsa.c128_decode(self.spec, self._t(rows, torch.float32), out, self.ape, self.main, seq,
                          load_indices=self.load, **self._store_args(self.b, closing))
        ref = self._decode_ref(rows, [True] * self.b)
        assert torch.equal(out.nan_to_num(7.0), ref.nan_to_num(7.0))
        self.load.copy_(self.main)

    def verify(self, verify_lens, accepted):
        b, v, d = self.b, self.v, self.d
        drafts = _rows(self.rng, b * v, d)
        out = torch.full((b * v, d), float("nan"), device=self.device)
        seq = self._t(self.seq)
        vl = None if verify_lens is None else self._t(verify_lens)
        lens0 = [v] * b if verify_lens is None else verify_lens
        closing = {r * v + j: (r, self.seq[r] + j) for r in range(b) for j in range(lens0[r])
                   if (self.seq[r] + j) % CHUNK == CHUNK - 1}
        pydsa.c128_verify(self.spec, self._t(drafts, torch.float32), out, self.ape, self.load, seq, self.bank,
                          bank_stride=self.stride, verify_lens=vl, **self._store_args(b * v, closing))
        for r in range(b):  # a closing draft that is not accepted: its entry is the engine's to ignore
            for j in range(lens0[r]):
                if j >= accepted[r]:
                    self.slot_of.pop((r, self.seq[r] + j), None)
        acc = self._t(accepted)
        if self.copying:
            pydsa.c128_commit(seq, acc, self.main, self.bank, num_drafts=v, bank_stride=self.stride, verify_lens=vl,
                              states=[self.spec])
        else:
            pydsa.c128_commit(seq, acc, self.load, self.bank, num_drafts=v, bank_stride=self.stride, verify_lens=vl,
                              load_indices=self.load, num_slots=self.spec.shape[0])
        lens = [v] * b if verify_lens is None else verify_lens
        for j in range(max(accepted)):
            live = [a > j for a in accepted]
            closing = [ok and self.seq[r] % CHUNK == CHUNK - 1 for r, ok in enumerate(live)]
            ref = self._decode_ref(np.ascontiguousarray(drafts[j::v]), live)
            for r in range(b):
                if closing[r]:  # the verify wrote the same vector at the draft's row
                    assert torch.equal(out[r * v + j], ref[r]), f"request {r} draft {j}: verify out != decode out"
        for r in range(b):  # rows of drafts past v_b are never written
            assert bool(out[r * v + lens[r]:(r + 1) * v].isnan().all())

    def check_states(self):
        """The state each request continues from equals the reference world's, bit for bit."""
        slots = (self.main if self.copying else self.load).cpu().tolist()
        for r in range(self.b):
            if self.seq[r] % CHUNK:
                assert torch.equal(self.spec[slots[r]], self.ref[r]), f"request {r} at {self.seq[r]}: states differ"


def _accept(data, seq, v_b):
    """An acceptance for a request at committed length seq with v_b drafts: none, all, at the chunk
    end, or anything."""
    to_end = CHUNK - seq % CHUNK
    choices = [0, v_b, data.draw(st.integers(0, v_b))] + ([to_end] if to_end <= v_b else [])
    return data.draw(st.sampled_from(choices))


def _schedule(worlds, data, steps):
    b, v = worlds.b, worlds.v
    for _ in range(steps):
        kind = data.draw(st.sampled_from(["verify", "verify", "verify", "decode", "prefill"]))
        if kind == "prefill":
            worlds.prefill([data.draw(st.integers(1, 200)) for _ in range(b)])
        elif kind == "decode":
            worlds.decode()
        else:
            lens = None if data.draw(st.booleans()) else [data.draw(st.integers(0, v)) for _ in range(b)]
            accepted = [_accept(data, worlds.seq[r], v if lens is None else lens[r]) for r in range(b)]
            worlds.verify(lens, accepted)
        worlds.check_states()


@pytest.mark.parametrize("device_name", DEVICES)
@pytest.mark.parametrize("state_dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("copying", [False, True], ids=["load-slots", "copying"])
@settings(max_examples=examples(12))
@given(data=st.data())
def test_any_schedule_equals_plain_decodes_of_the_accepted_tokens(device_name, state_dtype, copying, data):
    """Prefills, decodes and verify steps with any acceptances (none, all, partial, across chunk
    ends, at a chunk start) leave every state and output equal bit for bit to decoding only the
    accepted tokens, and every chunk vector within the bound of float64."""
    d = data.draw(st.sampled_from([64, 128]))
    b = data.draw(st.integers(1, 4))
    v = data.draw(st.sampled_from([1, 2, 3, 8, 8, 16]))
    worlds = Worlds(torch.device(device_name), d, b, v, state_dtype, copying, data.draw(st.integers(0, 2**16)))
    # First prefills end anywhere, often a few tokens before a chunk end.
    firsts = [data.draw(st.one_of(st.integers(1, 400), st.integers(1, 3).map(lambda k: 128 * k - 3),
                                  st.sampled_from([128, 256, 127]))) for _ in range(b)]
    worlds.prefill(firsts)
    _schedule(worlds, data, data.draw(st.integers(1, 8)))


@pytest.mark.parametrize("device_name", DEVICES)
@pytest.mark.parametrize("state_dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@settings(max_examples=examples(8))
@given(data=st.data())
def test_any_schedule_with_the_store_on_stores_every_accepted_chunk(device_name, state_dtype, data):
    """The schedule property with the store fused into the speculative world's prefill, decode and
    verify: every accepted chunk's cache entry equals the standalone store of its vector, bit for bit."""
    b = data.draw(st.integers(1, 3))
    v = data.draw(st.sampled_from([2, 8]))
    worlds = Worlds(torch.device(device_name), 128, b, v, state_dtype, False, data.draw(st.integers(0, 2**16)),
                    store=True)
    worlds.prefill([data.draw(st.one_of(st.integers(1, 300), st.integers(1, 2).map(lambda k: 128 * k - 2)))
                    for _ in range(b)])
    _schedule(worlds, data, data.draw(st.integers(1, 6)))


def test_the_store_checks_entries_of_prefill_decode_and_verify():
    """A fixed schedule around chunk ends with the store on: entries from every op were checked."""
    worlds = Worlds(torch.device("cpu"), 128, 3, 8, torch.float32, False, 5, store=True)
    worlds.prefill([120, 127, 1])  # request 1 closes its chunk on its next token
    worlds.decode()
    rng = np.random.default_rng(6)
    for step in range(40):
        worlds.verify(None, [int(rng.integers(0, 9)) for _ in range(3)])
        worlds.check_states()
    worlds.prefill([200, 200, 200])
    assert worlds.entries >= 6 and worlds.vectors == worlds.entries


def test_long_runs_of_rejections_and_chunk_crossings():
    """Many steps at V = 8 around chunk ends, with rejected steps between: nothing drifts, and
    vectors were emitted and checked on the way."""
    worlds = Worlds(torch.device("cpu"), 64, 3, 8, torch.float32, False, 3)
    worlds.prefill([120, 125, 1])
    rng = np.random.default_rng(4)
    for step in range(60):
        accepted = [0 if step % 3 == 0 else int(rng.integers(0, 9)) for _ in range(3)]
        worlds.verify(None, accepted)
        worlds.check_states()
    assert worlds.vectors >= 3


def _bank_case(device, state_dtype):
    gen = torch.Generator().manual_seed(11)
    d, b, v = 64, 3, 5
    slots = b + b * (v + 1)
    state = (torch.randn(slots, 1, 3 * d, generator=gen)).to(state_dtype)
    state[:b, :, d:2 * d] = torch.rand(b, 1, d, generator=gen).to(state_dtype) + 1
    args = dict(state=state, kv=torch.randn(b * v, 2 * d, generator=gen), ape=torch.randn(CHUNK, d, generator=gen),
                seq=torch.tensor([5, 126, 256], dtype=torch.int32), idx=torch.arange(b, dtype=torch.int32),
                bank=torch.tensor([b, b + v + 1, b + 2 * (v + 1)], dtype=torch.int32))
    return {k: t.to(device) for k, t in args.items()}, d, b, v


@pytest.mark.parametrize("device_name", DEVICES)
@pytest.mark.parametrize("state_dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_bank_entries_hold_every_prefix_and_nothing_else(device_name, state_dtype):
    """Entry j holds the state after j drafts, as j plain decodes leave it; entry 0 the state before
    them; entries whose prefix ends a chunk, main slots and rows of other drafts stay untouched."""
    a, d, b, v = _bank_case(torch.device(device_name), state_dtype)
    state = a["state"]
    poison = torch.full_like(state[b:], 77.0)
    state[b:] = poison
    before = state.clone()
    out = torch.full((b * v, d), float("nan"), device=state.device)
    pydsa.c128_verify(state, a["kv"], out, a["ape"], a["idx"], a["seq"], a["bank"])
    assert torch.equal(state[:b], before[:b]), "a main slot was written"
    ref = before[:b].clone()
    for j in range(v + 1):
        for r in range(b):
            pos = int(a["seq"][r]) + j  # tokens after prefix j
            entry = state[int(a["bank"][r]) + j]
            if pos % CHUNK == 0:
                assert bool((entry == 77.0).all()), f"request {r} entry {j} (a chunk end) was written"
            else:
                assert torch.equal(entry, ref[r]), f"request {r} entry {j} differs from {j} decodes"
        if j == v:
            break
        dec_out = torch.full((b, d), float("nan"), device=state.device)
        pydsa.c128_decode(ref, a["kv"][j::v].contiguous(), dec_out, a["ape"], a["idx"], a["seq"] + j + 1)
        for r in range(b):
            row = out[r * v + j]
            if (int(a["seq"][r]) + j) % CHUNK == CHUNK - 1:
                assert torch.equal(row, dec_out[r])
            else:
                assert bool(row.isnan().all())


@gpu
@pytest.mark.gpu
@pytest.mark.parametrize("state_dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("d", [128, 192, 512])
@pytest.mark.parametrize("b", [37, 300])  # one and two or four channels per thread
def test_gpu_matches_host_backend(state_dtype, d, b):
    """Verify and both commits on the GPU equal the host backend within fp32 rounding (bf16: one
    rounding step), for padding rows, partial draft counts and drafts across chunk ends."""
    gen = torch.Generator().manual_seed(d)
    v = 8
    slots = b + b * (v + 1)
    state = torch.randn(slots, 1, 3 * d, generator=gen)
    state[:, :, d:2 * d] = torch.rand(slots, 1, d, generator=gen) + 1
    state = state.to(state_dtype)
    seq = torch.randint(-2, 700, (b,), generator=gen, dtype=torch.int32)
    seq[:8] = torch.tensor([1, 127, 128, 124, 250, 256, 121, 0], dtype=torch.int32)
    args = dict(kv=torch.randn(b * v, 2 * d, generator=gen), ape=torch.randn(CHUNK, d, generator=gen), seq=seq,
                idx=torch.randperm(b, generator=gen).to(torch.int32),
                bank=(b + torch.randperm(b, generator=gen) * (v + 1)).to(torch.int32),
                lens=torch.randint(0, v + 1, (b,), generator=gen, dtype=torch.int32),
                acc=torch.randint(-1, v + 2, (b,), generator=gen, dtype=torch.int32))
    results = {}
    for dev in ("cpu", "cuda"):
        x = {k: t.to(dev) for k, t in args.items()}
        st_ = state.clone().to(dev)
        out = torch.full((b * v, d), float("nan"), device=dev)
        pydsa.c128_verify(st_, x["kv"], out, x["ape"], x["idx"], x["seq"], x["bank"], verify_lens=x["lens"])
        load = x["idx"].clone()
        pydsa.c128_commit(x["seq"], x["acc"], load, x["bank"], num_drafts=v, verify_lens=x["lens"], load_indices=load,
                          num_slots=slots)
        copied = [st_.clone(), st_.clone()]
        pydsa.c128_commit(x["seq"], x["acc"], x["idx"], x["bank"], num_drafts=v, verify_lens=x["lens"], states=copied)
        results[dev] = (st_.cpu().float(), out.cpu(), load.cpu(), [c.cpu().float() for c in copied])
    (hs, ho, hl, hc), (gs, go, gl, gc) = results["cpu"], results["cuda"]
    tol = dict(rtol=1e-5, atol=1e-5) if state_dtype == torch.float32 else dict(rtol=1e-2, atol=1e-2)
    torch.testing.assert_close(gs, hs, **tol)
    torch.testing.assert_close(go, ho, rtol=1e-5, atol=1e-5, equal_nan=True)
    assert torch.equal(gl, hl)
    for g, h in zip(gc, hc):
        torch.testing.assert_close(g, h, **tol)


@pytest.mark.parametrize("device_name", DEVICES)
def test_negative_slots_are_skipped_silently_and_out_of_range_ones_counted(device_name):
    """A negative load slot or bank base means 'not held on this GPU': skipped, not counted. A slot
    past the buffer is skipped and counted, in verify and in both commits."""
    a, d, b, v = _bank_case(torch.device(device_name), torch.float32)
    state, dev = a["state"], a["state"].device
    counter = torch.zeros(1, dtype=torch.int32, device=dev)
    before = state.clone()
    bank = torch.tensor([-1, state.shape[0] - 2, a["bank"][2]], dtype=torch.int32, device=dev)
    idx = torch.tensor([0, 1, -1], dtype=torch.int32, device=dev)  # request 2 starts a chunk: load not read
    out = torch.full((b * v, d), float("nan"), device=dev)
    pydsa.c128_verify(state, a["kv"], out, a["ape"], idx, a["seq"], bank, error_count=counter)
    assert int(counter) == 1  # request 1: its bank runs past the buffer
    assert torch.equal(state[:int(a["bank"][2])], before[:int(a["bank"][2])])  # only request 2's bank written
    load = idx.clone()
    acc = torch.tensor([2, 3, 3], dtype=torch.int32, device=dev)  # request 1 past its chunk end
    pydsa.c128_commit(a["seq"], acc, load, bank, num_drafts=v, load_indices=load, num_slots=state.shape[0],
                      error_count=counter)
    assert load.cpu().tolist() == [-1, -1, int(a["bank"][2]) + 3] and int(counter) == 2
    pydsa.c128_commit(a["seq"], acc, idx, bank, num_drafts=v, states=[state], error_count=counter)
    assert int(counter) == 3


def _bad_call(device, **change):
    a, d, b, v = _bank_case(device, torch.float32)
    args = dict(state=a["state"], kv_score=a["kv"], out=torch.empty(b * v, d, device=device), ape=a["ape"],
                indices=a["idx"], seq_lens=a["seq"], bank_indices=a["bank"])
    args.update(change)
    return args


@pytest.mark.parametrize("change, needle", [
    (dict(kv_score=torch.zeros(7, 128)), "kv_score"),
    (dict(kv_score=torch.zeros(3 * 17, 128)), "kv_score"),
    (dict(out=torch.zeros(15, 32)), "out"),
    (dict(indices=torch.zeros(3, dtype=torch.int64)), "indices"),
    (dict(bank_indices=torch.zeros(2, dtype=torch.int32)), "bank_indices"),
    (dict(seq_lens=torch.zeros(3, dtype=torch.float32)), "seq_lens"),
    (dict(ape=torch.zeros(127, 64)), "ape"),
    (dict(bank_stride=0), "bank_stride"),
    (dict(verify_lens=torch.zeros(4, dtype=torch.int32)), "verify_lens"),
])
def test_verify_refuses_bad_arguments_naming_them(change, needle):
    args = _bad_call(torch.device("cpu"), **change)
    state = args["state"].clone()
    with pytest.raises((TypeError, ValueError), match=needle):
        pydsa.c128_verify(**args)
    assert torch.equal(args["state"], state)


@pytest.mark.parametrize("change, needle", [
    (dict(num_drafts=0), "num_drafts"),
    (dict(num_drafts=17), "num_drafts"),
    (dict(accepted=torch.zeros(2, dtype=torch.int32)), "accepted"),
    (dict(load_indices=None), "load_indices"),
    (dict(bank_stride=-3), "bank_stride"),
    (dict(states=[]), "states"),
])
def test_commit_refuses_bad_arguments_naming_them(change, needle):
    a, d, b, v = _bank_case(torch.device("cpu"), torch.float32)
    args = dict(seq_lens=a["seq"], accepted=torch.zeros(b, dtype=torch.int32), indices=a["idx"],
                bank_indices=a["bank"], num_drafts=v, load_indices=torch.zeros(b, dtype=torch.int32))
    if "states" in change:
        args.pop("load_indices")
    args.update(change)
    with pytest.raises((TypeError, ValueError), match=needle):
        pydsa.c128_commit(**args)


def test_empty_batch_is_a_no_op():
    """B = 0: nothing read, nothing written (every buffer as it was), no error counted."""
    a, d, b, v = _bank_case(torch.device("cpu"), torch.float32)
    e = torch.zeros(0, dtype=torch.int32)
    before = a["state"].clone()
    errors = torch.zeros(1, dtype=torch.int32)
    pydsa.c128_verify(a["state"], torch.zeros(0, 2 * d), None, a["ape"], e, e, e, error_count=errors)
    pydsa.c128_commit(e, e, e, e, num_drafts=4, load_indices=e.clone(), error_count=errors)
    pydsa.c128_commit(e, e, e, e, num_drafts=4, error_count=errors, states=[a["state"]])
    assert torch.equal(a["state"], before) and int(errors.item()) == 0


@gpu
@pytest.mark.gpu
@pytest.mark.parametrize("copying", [False, True], ids=["load-slots", "copying"])
@pytest.mark.parametrize("b", [16, 200])
def test_verify_and_commit_replay_in_a_cuda_graph(copying, b):
    """A speculative step (verify for 3 layers, commit) captured once, replayed with new drafts and
    acceptances written into the captured buffers, equals the same calls made eagerly."""
    d, v, layers = 512, 8, 3
    gen = torch.Generator().manual_seed(5)
    slots = b + b * (v + 1)
    base = torch.randn(slots, 1, 3 * d, generator=gen)
    base[:, :, d:2 * d] = torch.rand(slots, 1, d, generator=gen) + 1
    ape = torch.randn(CHUNK, d, generator=gen).cuda()
    bank = (b + torch.arange(b) * (v + 1)).to(torch.int32).cuda()
    main = torch.arange(b, dtype=torch.int32).cuda()

    def buffers():
        return dict(states=[base.clone().cuda() for _ in range(layers)], drafts=torch.zeros(b * v, 2 * d).cuda(),
                    out=[torch.zeros(b * v, d).cuda() for _ in range(layers)], seq=torch.zeros(b, dtype=torch.int32).cuda(),
                    acc=torch.zeros(b, dtype=torch.int32).cuda(), load=main.clone())

    def step(verifies, commit):
        for op in verifies:
            op.launch()
        commit.launch()

    def ops(x):
        verifies = [pydsa.C128Verify(x["states"][i], x["drafts"], x["out"][i], ape, x["load"] if not copying else main,
                                     x["seq"], bank if not copying else main, bank_stride=1 if not copying else b)
                    for i in range(layers)]
        if copying:
            commit = pydsa.C128Commit(x["seq"], x["acc"], main, main, num_drafts=v, bank_stride=b, states=x["states"])
        else:
            commit = pydsa.C128Commit(x["seq"], x["acc"], x["load"], bank, num_drafts=v, load_indices=x["load"],
                                      num_slots=slots)
        return verifies, commit

    if copying:  # sglang's layout needs b * (v + 1) slots with entry j at r + j * b
        base = base[:b * (v + 1)].clone()
    graph_bufs, eager_bufs = buffers(), buffers()
    g_ops, e_ops = ops(graph_bufs), ops(eager_bufs)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        step(*g_ops)
    torch.cuda.current_stream().wait_stream(side)
    for x in (graph_bufs, eager_bufs):
        for st_ in x["states"]:
            st_.copy_(base.cuda())
        x["load"].copy_(main)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step(*g_ops)
    for x in (graph_bufs, eager_bufs):
        for st_ in x["states"]:
            st_.copy_(base.cuda())
        x["load"].copy_(main)
    seq = torch.randint(1, 600, (b,), generator=gen, dtype=torch.int32)
    for _ in range(4):
        drafts = torch.randn(b * v, 2 * d, generator=gen)
        acc = torch.randint(0, v + 1, (b,), generator=gen, dtype=torch.int32)
        for x in (graph_bufs, eager_bufs):
            x["drafts"].copy_(drafts)
            x["seq"].copy_(seq)
            x["acc"].copy_(acc)
        graph.replay()
        step(*e_ops)
        torch.cuda.synchronize()
        for key in ("states", "out"):
            for g_t, e_t in zip(graph_bufs[key], eager_bufs[key]):
                assert torch.equal(g_t, e_t)
        assert torch.equal(graph_bufs["load"], eager_bufs["load"])
        seq += acc


@gpu
def test_verify_on_a_device_that_is_not_current():
    """The op runs on the device owning its tensors (device 0 here), whatever the current device."""
    a, d, b, v = _bank_case(torch.device("cuda:0"), torch.float32)
    out = torch.full((b * v, d), float("nan"), device="cuda:0")
    pydsa.c128_verify(a["state"], a["kv"], out, a["ape"], a["idx"], a["seq"], a["bank"])
    torch.cuda.synchronize()
    assert not bool(out.isnan().all())


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("state_dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_verify_at_seq_zero_runs_the_drafts_from_position_zero(device, state_dtype):
    """seq_lens[b] == 0 is a request with no committed tokens (padding is seq < 0): its drafts start a
    chunk at position 0 and bank entry j holds the state after j decodes from nothing."""
    d, b, v = 256, 3, 5
    gen = torch.Generator().manual_seed(1)
    stale = (torch.randn(b * (v + 2), 1, 3 * d, generator=gen) * 50).to(state_dtype).to(device)
    drafts = torch.randn(b * v, 2 * d, generator=gen).to(device)
    ape = torch.randn(CHUNK, d, generator=gen).to(device)
    seq = torch.tensor([0, -1, 0], dtype=torch.int32, device=device)
    idx = torch.arange(b, dtype=torch.int32, device=device)
    bank = (b + idx * (v + 1)).to(torch.int32)
    state = stale.clone()
    pydsa.c128_verify(state, drafts, None, ape, idx, seq, bank)
    for r in range(b):
        entries = state[b + r * (v + 1): b + (r + 1) * (v + 1)]
        if r == 1:  # padding: nothing written
            assert torch.equal(entries, stale[b + r * (v + 1): b + (r + 1) * (v + 1)])
            continue
        ref = stale[:1].clone()
        for j in range(v):
            pydsa.c128_decode(ref, drafts[r * v + j: r * v + j + 1], torch.empty(1, d, device=device), ape,
                              torch.zeros(1, dtype=torch.int32, device=device),
                              torch.tensor([j + 1], dtype=torch.int32, device=device))
            assert torch.equal(entries[j + 1], ref[0]), (r, j)


@pytest.mark.parametrize("over", ["state", "kv_score", "ape", "out"])
def test_a_verify_store_whose_cache_lies_over_its_launchs_buffers_is_refused_by_name(over):
    """c128_verify with a store: a cache laid over the state, the drafts, the ape or out would be written while the
    verify reads or writes them. Refused naming store.cache before anything runs; the state unchanged."""
    gen = torch.Generator().manual_seed(5)
    d, b, v = 128, 2, 3
    state = torch.randn(b + b * (v + 1), 1, 3 * d, generator=gen)
    args = dict(state=state, kv_score=torch.randn(b * v, 2 * d, generator=gen),
                out=torch.zeros(b * v, d), ape=torch.randn(CHUNK, d, generator=gen),
                indices=torch.arange(b, dtype=torch.int32), seq_lens=torch.tensor([5, 126], dtype=torch.int32),
                bank_indices=torch.tensor([b, b + v + 1], dtype=torch.int32))
    page = pydsa.kv_page_bytes(d, 2)
    cache = args[over].view(torch.uint8).view(-1)[:page]
    store = pydsa.KVCache(cache, torch.rand(d, generator=gen) + 0.5, torch.randn(600, 64, generator=gen), page_size=2)
    before = state.clone()
    with pytest.raises(pydsa.ArgumentValueError, match="shares memory") as caught:
        pydsa.c128_verify(**args, store=store, cache_slots=torch.arange(b * v, dtype=torch.int64))
    assert caught.value.argument == "store.cache", str(caught.value)
    assert torch.equal(state, before)
