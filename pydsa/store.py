"""The KV-cache store: normalize, quantize and page compressed vectors into a layer's cache.

A chunk's compressed vector x [D] becomes one cache entry (docs/spec.md, "The store"): RMSNorm with
`norm_weight`, channels 0 .. D-65 as fp8 e4m3 with one power-of-two scale per 64 values, the last 64
channels rotated by the rotary table's row for the chunk's first position and stored as bf16. A
`KVCache` describes one layer's cache once; `c128_decode`, `c128_prefill` and `c128_verify` take it as `store=` with per-row `cache_slots` and store every vector they close in the
same launch, and `kv_store` stores given vectors.
"""
from __future__ import annotations

from . import _fill_store

__all__ = ["KVCache", "buffer_key", "kv_store", "kv_page_bytes", "indexer_page_bytes"]

# compiled (pydsa/_fill_store.pyx): the cache is judged once when made, and a call goes straight to its fill
KVCache = _fill_store.KVCache
kv_store = _fill_store.kv_store
kv_page_bytes = _fill_store.kv_page_bytes
indexer_page_bytes = _fill_store.indexer_page_bytes
buffer_key = _fill_store.buffer_key
