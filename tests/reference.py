"""Plainly written references the tests compare the library against."""
from __future__ import annotations

import numpy as np

from pydsa.baselines import plan_prefill_python as plan_reference  # noqa: F401

CHUNK = 128
SENTINEL = (0xFFFFFFFF,) * 4
# Largest norm-wise relative error of a chunk vector against the float64 formula with bf16 state
# (docs/spec.md, the state, output layouts), as documented in the README: measured max over the schedule property, with margin.
BF16_BOUND = 2.5e-2


def records(arr) -> list:
    return [tuple(int(x) for x in r) for r in arr.tolist()]


def compress_offline(kv: np.ndarray, score: np.ndarray, ape: np.ndarray) -> np.ndarray:
    """docs/spec.md, online c128 offline formula in float64: kv, score [128, D] of one chunk -> [D]."""
    t = score.astype(np.float64) + ape.astype(np.float64)
    t = t - t.max(axis=0, keepdims=True)
    w = np.exp(t)
    w /= w.sum(axis=0, keepdims=True)
    return (w * kv.astype(np.float64)).sum(axis=0)


def online_step_fp32(m, s, k, t, v):
    """docs/spec.md, the per-token update single-token update, fp32, exactly as written there."""
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
