"""The serving loop shared by the demo and the soak (pydsa/_serving.py): what it tells its observers about each
op call is what a request absorbed, and what the ops wrote agrees with it."""
import numpy as np
import torch

from pydsa import demo
from pydsa._abi import CHUNK
from pydsa._serving import ServingLoop, Workload


class Recorder:
    """An observer that keeps every launch's host arrays and its outputs."""

    def __init__(self, loop):
        self.loop, self.staged, self.seen = loop, [], []

    def stage(self, step):
        self.staged.append((step.index, self.loop.done.copy(), self.loop.active.copy()))

    def launched(self, step):
        self.seen.append([(x, x.out.cpu().numpy().copy()) for x in step.launches])


def _loop(seed=1, **kw):
    device = torch.device("cpu")
    store = demo.StoreChecker(device, 512, torch.Generator().manual_seed(seed)).cache
    w = Workload(4, 512, 200, drafts=4, cache_slots=256)
    loop = ServingLoop(w, device, seed=seed, store=store, pool_rows=1024, **kw)
    rec = Recorder(loop)
    loop.observers.append(rec)
    return loop, rec


def test_every_request_absorbs_its_committed_rows_in_order_and_each_chunk_end_has_a_vector():
    """Per request, the committed rows of each step continue exactly where it stood before the step and its
    length after is the last of them + 1; a row has an output row and a cache slot exactly when it is a real
    row at a chunk's end, and that output was written (not the NaN poison); tokens counts committed rows."""
    loop, rec = _loop()
    committed_total, kinds = 0, set()
    for i in range(40):
        before = loop.done.copy()
        loop.step(i)
        _, staged_done, _ = rec.staged[-1]
        assert np.array_equal(staged_done, before)
        advanced = np.zeros_like(before)
        for x, out in rec.seen[-1]:
            kinds.add(x.kind)
            real = x.owner >= 0
            assert not (x.committed & ~real).any()
            for s in np.unique(x.owner[x.committed]):
                pos = x.position[x.committed & (x.owner == s)]
                assert np.array_equal(pos, before[s] + advanced[s] + np.arange(len(pos)))
                advanced[s] += len(pos)
            ends = real & (x.position % CHUNK == CHUNK - 1)
            if x.kind == "verify":
                ends &= (np.arange(len(x.owner)) % loop.w.drafts) < np.repeat(
                    np.concatenate([x.lens, np.zeros(len(x.owner) // loop.w.drafts - len(x.lens), np.int64)]),
                    loop.w.drafts)
            assert np.array_equal(x.out_row >= 0, ends) and np.array_equal(x.cache_slot >= 0, ends)
            assert len(set(x.cache_slot[ends].tolist())) == int(ends.sum())
            assert not np.isnan(out[x.out_row[x.committed & ends]]).any()
            committed_total += int(x.committed.sum())
        served = advanced > 0
        assert np.array_equal(loop.done[served & loop.active], (before + advanced)[served & loop.active])
    assert loop.counts["tokens"] == committed_total
    assert kinds == {"prefill", "decode", "verify"}


def test_arrivals_stop_at_the_limit_and_slots_are_reused():
    """With a limit, no more requests arrive than it; without, finished requests' slots take new ones, and every
    step is busy."""
    loop, _ = _loop(seed=2, arrivals=3)
    for i in range(60):
        loop.step(i)
    assert loop.counts["arrived"] == 3
    endless, _ = _loop(seed=2)
    steps = 0
    while endless.counts["arrived"] <= endless.w.max_running and steps < 1000:
        endless.step(steps)
        steps += 1
    assert endless.counts["finished"] > 0 and endless.counts["arrived"] > endless.w.max_running
    assert endless.counts["busy"] == steps
