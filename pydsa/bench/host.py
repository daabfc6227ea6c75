"""Host time per call of every per-step op, one-shot and prepared, with and without the store,
against the empty ctypes launch measured in alternating blocks (harness.host_vs_empty): what a
call costs the engine's thread beyond the launch itself. B = 32 requests, D = 512, GPU tensors."""
from __future__ import annotations

import numpy as np
import torch

import pyplan

from ..c4 import C4Compressor, C4Decode, c4_decode
from ..c128 import C128Decode, C128Prefill, c128_decode, c128_prefill
from ..speculative import C128Verify, c128_commit, c128_verify
from ..store import KVCache, indexer_page_bytes, kv_page_bytes, kv_store
from .harness import host_vs_empty

B, V, DH = 32, 4, 512


def host_calls() -> dict:
    """name -> zero-argument call, over random data on the current CUDA device."""
    gen = torch.Generator().manual_seed(3)
    dev = torch.device("cuda")
    i32, i64 = dict(dtype=torch.int32, device=dev), dict(dtype=torch.int64, device=dev)
    d = DH
    ape = torch.randn(128, d, generator=gen).to(dev)
    state = (torch.rand(B * (V + 2), 1, 3 * d, generator=gen) + 1).to(dev)
    kv = torch.randn(B, 2 * d, generator=gen).to(dev)
    out = torch.empty(B, d, device=dev)
    idx = torch.arange(B, **i32)
    seq_lens = torch.randint(1, 5000, (B,), generator=gen, dtype=torch.int32).to(dev)
    cache = KVCache(torch.zeros(4096, kv_page_bytes(d, 2), dtype=torch.uint8, device=dev),
                    (torch.rand(d, generator=gen) + 0.5).to(dev), torch.randn(8192, 64, generator=gen).to(dev),
                    page_size=2)
    slots = torch.arange(B, **i64)
    seq = np.array([1100, 300, 77, 5000], np.int64)
    ext = np.array([100, 300, 77, 400], np.int64)
    plan = pyplan.plan_prefill(seq, ext)
    n = int(ext.sum())
    kvp, outp = torch.randn(n, 2 * d, generator=gen).to(dev), torch.empty(n, d, device=dev)
    pidx, pslots = torch.arange(4, **i32), torch.arange(n, **i64)
    drafts, out_drafts = torch.randn(B * V, 2 * d, generator=gen).to(dev), torch.empty(B * V, d, device=dev)
    bank = torch.arange(B, B + B * (V + 1), V + 1, **i32)
    dslots = torch.arange(B * V, **i64)
    accepted = torch.randint(0, V + 1, (B,), generator=gen, dtype=torch.int32).to(dev)
    load = idx.clone()
    positions = torch.arange(B, **i32) * 128
    # a c4 layer: both compressors over request-scoped rings of 8 rows, both stores
    rotary = torch.randn(8192, 64, generator=gen).to(dev)
    main = C4Compressor(torch.randn(B * 8, 4 * d, generator=gen).to(dev), torch.randn(8, d, generator=gen).to(dev),
                        ring_size=8,
                        store=KVCache(torch.zeros(B, kv_page_bytes(d, 64), dtype=torch.uint8, device=dev),
                                      (torch.rand(d, generator=gen) + 0.5).to(dev), rotary, page_size=64,
                                      layout="v4"))
    indexer = C4Compressor(torch.randn(B * 8, 512, generator=gen).to(dev), torch.randn(8, 128, generator=gen).to(dev),
                           ring_size=8,
                           store=KVCache(torch.zeros(B, indexer_page_bytes(128, 64), dtype=torch.uint8, device=dev),
                                         (torch.rand(128, generator=gen) + 0.5).to(dev), rotary, page_size=64,
                                         layout="indexer"))
    c4_kv, c4_ikv = torch.randn(B, 4 * d, generator=gen).to(dev), torch.randn(B, 512, generator=gen).to(dev)
    c4_seq = torch.randint(1, 5000, (B,), generator=gen, dtype=torch.int32).to(dev)
    c4_args = dict(indexer=indexer, indexer_kv_score=c4_ikv, seq_lens=c4_seq, slots=idx,
                   cache_slots=slots)
    prepared = dict(
        decode=C128Decode(state, kv, out, ape, idx, seq_lens),
        decode_store=C128Decode(state, kv, None, ape, idx, seq_lens, store=cache, cache_slots=slots),
        prefill=C128Prefill(state, kvp, outp, ape, pidx, plan),
        prefill_store=C128Prefill(state, kvp, None, ape, pidx, plan, store=cache, cache_slots=pslots),
        verify=C128Verify(state, drafts, out_drafts, ape, idx, seq_lens, bank),
        verify_store=C128Verify(state, drafts, None, ape, idx, seq_lens, bank, store=cache, cache_slots=dslots),
        c4_decode=C4Decode(main, c4_kv, **c4_args))
    return {
        "decode": lambda: c128_decode(state, kv, out, ape, idx, seq_lens),
        "decode + store": lambda: c128_decode(state, kv, None, ape, idx, seq_lens, store=cache, cache_slots=slots),
        "prefill (pyplan plan)": lambda: c128_prefill(state, kvp, outp, ape, pidx, plan),
        "prefill + store": lambda: c128_prefill(state, kvp, None, ape, pidx, plan, store=cache, cache_slots=pslots),
        "verify": lambda: c128_verify(state, drafts, out_drafts, ape, idx, seq_lens, bank),
        "verify + store": lambda: c128_verify(state, drafts, None, ape, idx, seq_lens, bank, store=cache,
                                              cache_slots=dslots),
        "commit (load slots)": lambda: c128_commit(seq_lens, accepted, idx, bank, load_indices=load, num_drafts=V),
        "kv_store": lambda: kv_store(out, positions, slots, cache),
        "c4 decode (both compressors + stores)": lambda: c4_decode(main, c4_kv, **c4_args),
        **{f"prepared {name.replace('_store', ' + store').replace('_', ' ')}": call.launch
           for name, call in prepared.items()},
    }


def bench_host(rows: list) -> None:
    for name, call in host_calls().items():
        us, empty = host_vs_empty(call, n=1000, fetch_stream=True)
        rows.append(dict(kernel="host", case=name, host_us=us, host_empty_us=empty, over_empty_us=us - empty))
    torch.cuda.synchronize()
