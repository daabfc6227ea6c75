"""The KV-cache store: normalize, quantize and page compressed vectors into a layer's cache.

A chunk's compressed vector x [D] becomes one cache entry (docs/spec.md, "The store"): RMSNorm with
`norm_weight`, channels 0 .. D-65 as fp8 e4m3 with one power-of-two scale per 64 values, the last 64
channels rotated by the rotary table's row for the chunk's first position and stored as bf16. A
`KVCache` describes one layer's cache once; `c128_decode`, `c128_prefill` and `c128_verify` take it as `store=` with per-row `cache_slots` and store every vector they close in the
same launch, and `kv_store` stores given vectors.
"""
from __future__ import annotations

import ctypes as C

import torch

from . import _abi, _fill_store, _read
from ._abi import CACHE_INDEXER, CACHE_V4, KvCache, lib, new
from ._tensors import _float32, as_tensor, device_index, ptr
from .errors import ArgumentValueError, int_argument

__all__ = ["KVCache", "kv_store", "kv_page_bytes", "indexer_page_bytes"]

_int64 = torch.int64


def _page_size(page_size) -> None:
    if isinstance(page_size, bool) or not isinstance(page_size, int) or not 1 <= page_size <= 1024 \
            or page_size & (page_size - 1):
        raise ArgumentValueError("page_size", f"page_size must be a power of two in 1..1024 (got {page_size!r})")


def kv_page_bytes(head_dim: int = 512, page_size: int = 2) -> int:
    """Bytes of one cache page: page_size entries of D + 64 data bytes and a scale row of 8 bytes
    per 512 channels, padded to a multiple of D + 64 (D = 512, page 2: 1728)."""
    _page_size(page_size)
    n = lib.dsa_kv_page_bytes(int_argument(head_dim, "head_dim", 128, 2 ** 16, " (a multiple of 64)"), page_size)
    if n <= 0:
        raise ArgumentValueError("head_dim", f"head_dim must be a multiple of 64 >= 128 and page_size >= 1 (got {head_dim}, {page_size})")
    return n


def indexer_page_bytes(head_dim: int = 128, page_size: int = 64) -> int:
    """Bytes of one page of the c4 indexer's cache: page_size entries of 128 fp8 codes and a 4-byte fp32
    scale (page 64: 8448)."""
    _page_size(page_size)
    n = lib.dsa_indexer_page_bytes(int_argument(head_dim, "head_dim", 128, 128, " (the indexer's D)"), page_size)
    if n <= 0:
        raise ArgumentValueError("head_dim", f"head_dim must be 128 and page_size >= 1 for an indexer cache (got {head_dim}, "
                                 f"{page_size})")
    return n


LAYOUTS = {"v4": CACHE_V4, "indexer": CACHE_INDEXER}


class KVCache:
    """One layer's paged cache and what storing into it needs, checked once.

    cache: uint8 [num_pages, kv_page_bytes(D, page_size)] (or any contiguous uint8 tensor of whole
    pages); norm_weight: float32 [D]; rotary: float32 [num_positions, 64], (cos, sin) of pair l at
    columns 2l, 2l+1 (complex64 [num_positions, 32] is taken through view_as_real); page_size: a
    power of two in 1..1024; eps: the RMSNorm epsilon. Cache slot `loc` is entry loc % page_size of page
    loc // page_size.

    dcp=(world, rank): this cache is rank `rank`'s share of a cache sharded over `world` GPUs
    (decode-context parallelism): the entry of slot `loc` is written here only when loc % world == rank,
    at local slot loc // world; slots other ranks own are skipped silently, as negative ones are. Every
    storing op honors it on the GPU and the host backend.

    layout="indexer": the c4 indexer's cache (D = 128; docs/spec.md, "The stores of a c4 layer"): an entry is the
    normed vector with its last 64 channels rotated (fp32), Hadamard-transformed, as 128 fp8 e4m3 codes
    with one fp32 scale; a page holds page_size entries' codes, then their scales (indexer_page_bytes).
    Only the c4 ops store into it."""

    def __init__(self, cache, norm_weight, rotary, *, page_size: int, eps: float = 1e-6, dcp=(1, 0),
                 layout: str = "v4"):
        if layout not in LAYOUTS:
            raise ArgumentValueError("layout", f"layout must be 'v4' or 'indexer' (got {layout!r})")
        _page_size(page_size)
        if not isinstance(eps, (int, float)) or isinstance(eps, bool) or not 0.0 <= float(eps) < float("inf"):
            raise ArgumentValueError("eps", f"eps must be a finite number >= 0 (got {eps!r})")
        try:
            world, rank = (int(dcp[0]), int(dcp[1])) if len(dcp) == 2 else (None, None)
        except (TypeError, ValueError):
            world = rank = None
        if world is None or world < 1 or not 0 <= rank < world or world >= 2 ** 31:
            raise ArgumentValueError("dcp", f"dcp must be (world, rank) with world >= 1 and 0 <= rank < world (got {dcp!r})")
        cache, norm_weight = as_tensor(cache, "cache"), as_tensor(norm_weight, "norm_weight")
        if not isinstance(rotary, torch.Tensor):
            rotary = as_tensor(rotary, "rotary")
        if norm_weight.dim() != 1:
            raise ArgumentValueError("norm_weight", f"norm_weight must be a 1-D float32 tensor [D] (got shape {tuple(norm_weight.shape)})")
        d = norm_weight.shape[0]
        if layout == "indexer":
            if d != 128:
                raise ArgumentValueError("norm_weight", f"norm_weight has {d} channels; an indexer cache needs D = 128")
            page = indexer_page_bytes(d, page_size)
        else:
            page = kv_page_bytes(d, page_size) if d >= 128 and d % 64 == 0 else None
        if page is None:
            raise ArgumentValueError("norm_weight", f"norm_weight has {d} channels; a store needs D a multiple of 64, >= 128")
        if isinstance(rotary, torch.Tensor) and rotary.is_complex():
            rotary = torch.view_as_real(rotary).flatten(-2)
        dev = device_index(cache)
        if cache.dtype != torch.uint8:
            raise ArgumentValueError("cache", f"cache must be a uint8 tensor (got {cache.dtype})")
        if not cache.is_contiguous():
            raise ArgumentValueError("cache", f"cache must be contiguous (got shape {tuple(cache.shape)}, strides {cache.stride()})")
        if cache.numel() % page != 0 or cache.numel() == 0:
            raise ArgumentValueError("cache", f"cache holds {cache.numel()} bytes; a cache for D = {d}, page_size {page_size} is whole "
                             f"{page}-byte pages (the D comes from norm_weight's {d} channels)")
        if not isinstance(rotary, torch.Tensor) or rotary.dim() != 2:
            raise ArgumentValueError("rotary", "rotary must be a 2-D float32 tensor [num_positions, 64]")
        ptr(norm_weight, "norm_weight", _float32, dev, (d,))
        ptr(rotary, "rotary", _float32, dev, (rotary.shape[0], 64))
        s = new(KvCache)
        s.layout = LAYOUTS[layout]
        s.cache = cache.data_ptr()
        s.num_pages = cache.numel() // page
        s.page_size = page_size
        s.eps = float(eps)
        s.norm_weight = norm_weight.data_ptr()
        s.rotary = rotary.data_ptr()
        s.num_positions = rotary.shape[0]
        s.dcp_world, s.dcp_rank = world, rank
        self._struct = s
        self.address = C.addressof(s)
        self._keep = (cache, norm_weight, rotary)
        self.cache, self.norm_weight, self.rotary = cache, norm_weight, rotary
        self.head_dim, self.page_size, self.page_bytes = d, page_size, page
        self.num_pages, self.eps, self.device = s.num_pages, float(eps), dev
        self.dcp = (world, rank)
        self.layout = layout

    def __repr__(self) -> str:
        dcp = f", dcp={self.dcp}" if self.dcp[0] > 1 else ""
        return (f"KVCache(D={self.head_dim}, pages={self.num_pages} x {self.page_size}, "
                f"{self.page_bytes} B/page, device={self.cache.device}{dcp})")


_read.register_type("kv_cache", KVCache)


kv_store = _fill_store.kv_store  # compiled: the call goes straight to its fill (pydsa/_fill_store.pyx)

del _abi
