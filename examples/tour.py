"""A tour of pydsa on built-in data: prefill, decode with the KV-cache store fused, a speculative step,
and a metadata refresh. Runs on the host backend (CPU tensors) everywhere and on a GPU with
`--device cuda`. Every index tensor is int32 except cache slots (int64) and the planner's lengths
(int64 numpy arrays).

    python examples/tour.py [--device cpu|cuda]
"""
import argparse

import numpy as np
import torch

import pydsa
import pyplan

ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
dev = torch.device(ap.parse_args().device)
if dev.type == "cuda" and not torch.cuda.is_available():
    raise SystemExit("--device cuda: no CUDA device is available here; run without it for the host backend")
i32 = dict(dtype=torch.int32, device=dev)

D, B, V = 512, 4, 3                       # head dim, requests, drafts per request
num_slots = B * (V + 2)                   # main slots 0..B-1, then a bank of V + 1 entries per request
state = torch.zeros(num_slots, 1, 3 * D, device=dev)           # [m | s | k] per slot; fp32 or bf16
ape = torch.randn(128, D, device=dev)                          # score bias by in-chunk position
slots = torch.arange(B, **i32)                                 # request b keeps its state in slot b

# A layer's paged cache (fp8 + bf16 rope, page size 2) and what storing into it needs.
page_size, max_pos = 2, 8192
cache = torch.zeros(512, pydsa.kv_page_bytes(D, page_size), dtype=torch.uint8, device=dev)   # 1024 slots
angles = torch.rand(max_pos, 32, device=dev) * 6.28
rotary = torch.stack([angles.cos(), angles.sin()], -1).reshape(max_pos, 64)   # (cos, sin) per pair
layer_cache = pydsa.KVCache(cache, torch.ones(D, device=dev), rotary, page_size=page_size, eps=1e-6)

# Prefill: plan on the host once per step (int64 lengths), compress per layer. kv_score is ragged [N, 2D].
seq_lens = np.array([300, 127, 128, 5], np.int64)
extend_lens = seq_lens.copy()
plan = pyplan.plan_prefill(seq_lens, extend_lens)              # (compress, write) segment records
n = int(extend_lens.sum())
kv_score = torch.randn(n, 2 * D, device=dev)
cache_slots = torch.arange(n, dtype=torch.int64, device=dev)  # the cache slot of the vector each row closes
out = torch.zeros(len(plan[0]), D, device=dev)
pydsa.c128_prefill(state, kv_score, out, ape, slots, plan, compact=True, store=layer_cache, cache_slots=cache_slots)
print(f"prefill: {n} tokens, {len(plan[0])} chunk vectors (compact out) stored into the cache")

# Decode steps: one token per request; a request whose length hits a multiple of 128 closes a chunk.
lengths = torch.tensor(seq_lens, **i32)
for step in range(3):
    lengths += 1
    step_slots = torch.arange(B, dtype=torch.int64, device=dev) + n + step * B
    pydsa.c128_decode(state, torch.randn(B, 2 * D, device=dev), None, ape, slots, lengths,
                      store=layer_cache, cache_slots=step_slots)
print(f"decode: lengths now {lengths.tolist()}; chunks closed at 128 went straight to the cache")

# A speculative step: verify V drafts per request, accept some on the device, commit without a copy.
bank = (B + torch.arange(B, **i32) * (V + 1)).to(torch.int32)
pydsa.c128_verify(state, torch.randn(B * V, 2 * D, device=dev), None, ape, slots, lengths, bank)
accepted = torch.tensor([0, 1, 2, 3], **i32)
load = torch.empty(B, **i32)
pydsa.c128_commit(lengths, accepted, slots, bank, num_drafts=V, load_indices=load, num_slots=num_slots)
print(f"verify + commit: next step reads the states from slots {load.tolist()}")

# A c4 layer: the main compressor (D = 512) and the indexer's (D = 128) over request-scoped rings of R rows,
# both caches (page 64). One launch per decode step writes both rings and closes and stores both entries.
R = 16                                                          # 16 rows serve verifies of up to R - 6 drafts
compressors = []
for d, layout in ((512, "v4"), (128, "indexer")):
    page = pydsa.kv_page_bytes(d, 64) if layout == "v4" else pydsa.indexer_page_bytes(d, 64)
    c4_cache = pydsa.KVCache(torch.zeros(8, page, dtype=torch.uint8, device=dev), torch.ones(d, device=dev), rotary,
                             page_size=64, layout=layout)
    compressors.append(pydsa.C4Compressor(torch.zeros(B * R, 4 * d, device=dev), torch.randn(8, d, device=dev),
                                          store=c4_cache, ring_size=R))   # B slots of R rows: the ring owns R
main, indexer = compressors
c4_lens = np.array([9, 4, 13, 6], np.int64)                    # a prefill, planned on the host
c4_plan = pyplan.plan_c4(c4_lens, c4_lens, np.arange(B), R, num_slots=main.num_slots)   # carries its geometry
n4 = int(c4_lens.sum())
c4_slots = torch.arange(n4, dtype=torch.int64, device=dev) // 4   # the cache slot of the entry each row closes
pydsa.c4_extend(main, torch.randn(n4, 2048, device=dev), c4_plan.to(dev), indexer=indexer,
                indexer_kv_score=torch.randn(n4, 512, device=dev), cache_slots=c4_slots)
c4_seq = torch.tensor(c4_lens + 1, **i32)                      # a decode step: one token per request
pydsa.c4_decode(main, torch.randn(B, 2048, device=dev), indexer=indexer, indexer_kv_score=torch.randn(B, 512, device=dev),
                seq_lens=c4_seq, slots=slots, cache_slots=torch.arange(B, dtype=torch.int64, device=dev) + 64)
pydsa.c4_verify(main, torch.randn(B * V, 2048, device=dev), c4_seq, slots, num_drafts=V, indexer=indexer,
                indexer_drafts=torch.randn(B * V, 512, device=dev),
                cache_slots=torch.arange(B * V, dtype=torch.int64, device=dev) + 128)
print(f"c4: {len(c4_plan[0])} entries from a prefill, a decode step and a verify of {V} drafts "
      f"(up to {pydsa.c4_max_drafts(R)} with R = {R}), both caches stored")

# Metadata refresh of one backend's static buffers (int32), DECODE mode: one launch for every field.
max_len = 16
static = {"cache_seqlens": torch.zeros(B, **i32), "cu_seqlens_k": torch.zeros(B + 1, **i32),
          "page_table_1": torch.zeros(B, max_len + 4, **i32), "dsa_cache_seqlens": torch.zeros(B, **i32),
          "dsa_cu_seqlens_k": torch.zeros(B + 1, **i32)}
copy = pydsa.MetadataCopy([static], mode="decode")
cache_seqlens = lengths.clone()
cu = torch.zeros(B + 1, **i32)
cu[1:] = torch.cumsum(cache_seqlens, 0)
copy(cache_seqlens, cu, torch.arange(B * max_len, **i32).reshape(B, max_len), cache_seqlens, cu)
assert torch.equal(static["cache_seqlens"], cache_seqlens) and torch.equal(static["cu_seqlens_k"][1:], cu[1:])
print(f"metadata: {len(static)} fields refreshed in one launch")
# Out-of-range slots inside tensors are skipped and counted on the device, never dereferenced.
assert pydsa.error_count(dev) == 0, "a slot was out of range"
print("tour: OK")
