"""The serving loop shared by the demo and the soak (pydsa/_serving.py): what it tells its observers about each
op call is what a request absorbed, and what the ops wrote agrees with it."""
import numpy as np
import pytest
import torch

from pydsa import demo
from pydsa._abi import CHUNK
from pydsa._serving import Workload
from pydsa._serving_offline import serving_loop


class Recorder:
    """An observer that keeps every launch's host arrays and its outputs."""

    def __init__(self, loop):
        self.loop, self.staged, self.seen = loop, [], []

    def stage(self, step):
        self.staged.append((step.index, self.loop.done.copy(), self.loop.active.copy()))

    def launched(self, step):
        self.seen.append([(x, x.out.cpu().numpy().copy()) for x in step.launches])


def _loop(seed=1, config="online", **kw):
    device = torch.device("cpu")
    store = demo.StoreChecker(device, 512, torch.Generator().manual_seed(seed)).cache
    w = Workload(4, 512, 200, drafts=4, cache_slots=256)
    loop = serving_loop(config, w, device, seed=seed, store=store, pool_rows=1024, **kw)
    rec = Recorder(loop)
    loop.observers.append(rec)
    return loop, rec


@pytest.mark.parametrize("config", ["online", "default"])
def test_every_request_absorbs_its_committed_rows_in_order_and_each_chunk_end_has_a_vector(config):
    """Per request, the committed rows of each step continue exactly where it stood before the step and its
    length after is the last of them + 1; a row has an output row and a cache slot exactly when it is a real
    row at a chunk's end, and that output was written (not the NaN poison); tokens counts committed rows."""
    loop, rec = _loop(config=config)
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
            if x.kind == "verify" and config == "online":  # padded to V a request (the offline one: ragged)
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


@pytest.mark.parametrize("config", ["online", "default"])
def test_arrivals_stop_at_the_limit_and_slots_are_reused(config):
    """With a limit, no more requests arrive than it; without, finished requests' slots take new ones, and every
    step is busy."""
    loop, _ = _loop(seed=2, arrivals=3, config=config)
    for i in range(60):
        loop.step(i)
    assert loop.counts["arrived"] == 3
    endless, _ = _loop(seed=2, config=config)
    steps = 0
    while endless.counts["arrived"] <= endless.w.max_running and steps < 1000:
        endless.step(steps)
        steps += 1
    assert endless.counts["finished"] > 0 and endless.counts["arrived"] > endless.w.max_running
    assert endless.counts["busy"] == steps


def test_the_default_config_serves_an_offline_ring_with_uncommitted_speculative_steps():
    """--config default: the layer is a C128Ring of 256 rows a slot (drafts past a chunk end fit), a verify is an
    extend over 1..V drafts per request with nothing committed past the accepted ones, and no op counts an index
    error; a leak (a commit fault) is refused naming it."""
    import pydsa
    loop, rec = _loop(seed=3, config="default")
    assert loop.config == "default" and isinstance(loop.ring, pydsa.C128Ring) and loop.ring_size == 256
    for i in range(40):
        loop.step(i)
    verifies = [x for launches in rec.seen for x, _ in launches if x.kind == "verify"]
    assert verifies and all(len(x.owner) == int(x.lens.sum()) and (x.lens >= 1).all() for x in verifies)
    assert sum(int((x.lens - x.advance).sum()) for x in verifies) > 0 and int(loop.errors.item()) == 0
    with pytest.raises(pydsa.ArgumentError, match="leak") as e:
        _loop(config="default", leak=True)
    assert e.value.argument == "leak"
