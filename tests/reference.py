"""Plainly written references the tests compare the library against."""
from __future__ import annotations

import numpy as np
import torch

CHUNK = 128
SENTINEL = (0xFFFFFFFF,) * 4


def plan_reference(seq_lens, extend_lens):
    """SPEC 1.4, one token at a time: returns (compress, write) lists of 4-tuples."""
    compress, write = [], []
    ragged = 0
    for b, (seq, ext) in enumerate(zip(seq_lens, extend_lens)):
        prefix = seq - ext
        start = prefix
        for pos in range(prefix, seq):
            closes = pos % CHUNK == CHUNK - 1
            last = pos == seq - 1
            if closes or last:
                record = (ragged + pos - prefix, b, pos, pos - start + 1)
                (compress if closes else write).append(record)
                start = pos + 1
        ragged += ext
    return compress, write


def records(arr) -> list:
    return [tuple(int(x) for x in r) for r in arr.tolist()]


def compress_offline(kv: np.ndarray, score: np.ndarray, ape: np.ndarray) -> np.ndarray:
    """SPEC 1 offline formula in float64: kv, score [128, D] of one chunk -> [D]."""
    t = score.astype(np.float64) + ape.astype(np.float64)
    t = t - t.max(axis=0, keepdims=True)
    w = np.exp(t)
    w /= w.sum(axis=0, keepdims=True)
    return (w * kv.astype(np.float64)).sum(axis=0)


def online_step_fp32(m, s, k, t, v):
    """SPEC 1.1 single-token update, fp32, exactly as written there."""
    M = np.maximum(m, t)
    a = s * np.exp(m - M)
    b = np.exp(t - M)
    s2 = a + b
    return M, s2, (k * a + v * b) / s2


def rel_err(x, ref) -> float:
    x = np.asarray(x, np.float64)
    ref = np.asarray(ref, np.float64)
    return float(np.linalg.norm(x - ref) / np.linalg.norm(ref))


class TokenStream:
    """Deterministic random per-request token rows: row(b, pos) -> [kv | score] (2D floats)."""

    def __init__(self, d: int, seed: int):
        self.d = d
        self.seed = seed
        self._cache: dict = {}

    def rows(self, b: int, start: int, stop: int) -> np.ndarray:
        out = np.empty((stop - start, 2 * self.d), np.float32)
        for i, pos in enumerate(range(start, stop)):
            key = (b, pos)
            if key not in self._cache:
                rng = np.random.default_rng((self.seed, b, pos))
                kv = rng.standard_normal(self.d, dtype=np.float32)
                score = (rng.standard_normal(self.d, dtype=np.float32) * 3).astype(np.float32)
                self._cache[key] = np.concatenate([kv, score])
            out[i] = self._cache[key]
        return out

    def chunk_vector(self, b: int, chunk: int, ape: np.ndarray) -> np.ndarray:
        rows = self.rows(b, chunk * CHUNK, (chunk + 1) * CHUNK)
        return compress_offline(rows[:, :self.d], rows[:, self.d:], ape)


def metadata_copy_reference(src: dict, dst: dict, mode: str) -> None:
    """The per-field torch copy sequence an attention backend runs today (SPEC 2)."""
    bs = src["cache_seqlens"].shape[0]
    dst["cache_seqlens"][:bs].copy_(src["cache_seqlens"])
    dst["cu_seqlens_k"][1:bs + 1].copy_(src["cu_seqlens_k"][1:])
    rows, width = src["page_indices"].shape
    dst["page_table_1"][:rows, :width].copy_(src["page_indices"])
    n = bs
    if mode != "decode":
        n = src["seqlens_expanded"].shape[0]
        dst["seqlens_expanded"][:n].copy_(src["seqlens_expanded"])
    dst["dsa_cache_seqlens"][:n].copy_(src["dsa_cache_seqlens"])
    dst["dsa_cu_seqlens_k"][1:n + 1].copy_(src["dsa_cu_seqlens_k"][1:])
    if src.get("real_page_table") is not None:
        r, c = src["real_page_table"].shape
        dst["real_page_table"][:r, :c].copy_(src["real_page_table"])
    if src.get("num_splits") is not None:
        dst["flashmla_num_splits"][:n + 1].copy_(src["num_splits"])
        m = src["flashmla_metadata"].shape[0]
        dst["flashmla_metadata"][:m].copy_(src["flashmla_metadata"])
