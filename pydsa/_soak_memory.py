"""The soak's memory judgement: does anything grow that a leak would grow, beyond what the allocators' own
noise explains?

Three measures, sampled every `every` steps (at most SAMPLES samples, so a run of any length judges a series
of the same size at the same cost; a sample reads counters only, it never waits for the device):
- device: the bytes of live tensors in torch's CUDA caching allocator (GPU only). Exact: after the warm-up
  it must never rise above its level at the warm-up's end.
- heap: the bytes the host's malloc has handed out and not had back (glibc: mallinfo2's in-use chunks plus
  its mmapped ones; torch's host tensors and numpy's arrays are among them). Exact but for the few numpy
  and Python buffers a step leaves alive until the next (about 0.1 MB).
- resident: the process's resident memory less the free bytes malloc keeps for reuse. Resident memory
  alone wanders with what the allocator keeps (a 200-step run on the host backend: +184 MB while the heap
  in use moved 0.2 MB): those free bytes are that wander. (Without glibc: heap unknown, resident judged
  whole.)

A noisy measure (heap, resident) is judged over the samples after the warm-up (the first quarter of the
steps), in thirds: growth = the median of the last third - the highest level of the first (the maximum of
its running median of 7, which drops peaks up to 3 samples long). It passes while growth <= floor + 4 *
noise, noise = the robust spread (1.4826 * median absolute deviation) of the sample-to-sample changes.
Transient peaks (a check's temporaries), memory given back, and a one-off rise within the first third
(memory taken once and kept) are not growth. A leak of L MB every N steps is: the median of the last third
stands at least L above the first third's level once the judged span holds 2N steps, and its changes (a
constant, or zero between leaks) add no noise. So the planted leak of the tests (one request's 4 MiB every
50 steps) fails the heap in a 200-step run on the host backend, and the device memory on a GPU, every
time; the allocator's wander passes."""
from __future__ import annotations

import ctypes
import os

import numpy as np
import torch

SAMPLES = 256
MEASURES = ("device", "heap", "resident")
FLOOR_MB = dict(device=0.0, heap=1.0, resident=16.0)  # growth always tolerated: a step's leftovers, page tables
NOISE_K = 4.0


class _MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks",
                                                      "fsmblks", "uordblks", "fordblks", "keepcost")]


def _mallinfo2():
    try:
        f = ctypes.CDLL(None).mallinfo2
    except (OSError, AttributeError):  # not glibc >= 2.33
        return None
    f.restype, f.argtypes = _MallInfo2, []
    return f


_MALLINFO2 = _mallinfo2()
_PAGE_MB = os.sysconf("SC_PAGE_SIZE") / 2**20


def host_mb() -> tuple[float, float, float]:
    """(heap in use, resident less the allocator's free bytes, resident) in MB; NaN where unknown."""
    try:
        with open("/proc/self/statm") as f:
            resident = int(f.read().split()[1]) * _PAGE_MB
    except (OSError, ValueError):
        resident = float("nan")
    if _MALLINFO2 is None:
        return float("nan"), resident, resident
    m = _MALLINFO2()
    return (m.uordblks + m.hblkhd) / 2**20, resident - m.fordblks / 2**20, resident


def growth(values, floor_mb: float, *, exact: bool = False) -> dict:
    """The judgement of one measure's samples after the warm-up (in step order, evenly spaced): growth_mb,
    band_mb (the growth tolerated), ok. exact: any rise above the first value fails. Fewer than 6 samples,
    or a measure not known (NaN), are not judged (ok, growth NaN)."""
    y = np.asarray(values, np.float64)
    if len(y) < 6 or np.isnan(y).any():
        return dict(growth_mb=float("nan"), band_mb=float("nan"), ok=True)
    if exact:
        g = float(y.max() - y[0])
        return dict(growth_mb=g, band_mb=0.0, ok=g <= 0.0)
    third = len(y) // 3
    width = min(7, third)  # a running median this wide drops peaks up to (width - 1) // 2 samples long
    early = np.median(np.lib.stride_tricks.sliding_window_view(y[:third], width), axis=1).max()
    g = float(np.median(y[-third:]) - early)
    dy = np.diff(y)
    band = floor_mb + NOISE_K * 1.4826 * float(np.median(np.abs(dy - np.median(dy))))
    return dict(growth_mb=g, band_mb=band, ok=g <= band)


class MemoryTrace:
    """The memory of a run of `steps` steps, sampled at most SAMPLES times into a buffer made up front (the
    trace adds nothing as it runs); judge() the growth after the warm-up."""

    def __init__(self, steps: int, device: torch.device):
        self.every = -(-steps // SAMPLES)  # at most SAMPLES samples, and the last step
        self.steps, self.cuda, self.device = steps, device.type == "cuda", device
        self.rows = np.full((steps // self.every + 1, 2 + len(MEASURES)), np.nan)  # step, measures, resident
        self.n = 0

    def now(self) -> tuple[float, float, float, float]:
        """(device, heap, resident less free, resident) MB now."""
        dev = torch.cuda.memory_allocated(self.device) / 2**20 if self.cuda else float("nan")
        return (dev, *host_mb())

    def sample(self, step: int) -> None:
        """Called after every step (0-based); keeps every `every`-th and the last."""
        if (step + 1) % self.every == 0 or step + 1 == self.steps:
            self.rows[self.n] = (step + 1, *self.now())
            self.n += 1

    def judge(self) -> dict:
        """Per measure: first_mb and last_mb (over the run), growth_mb, band_mb, ok (after the warm-up); the
        resident memory's first and last as it is ("rss", not judged)."""
        rows = self.rows[:self.n]
        judged = rows[rows[:, 0] > self.steps // 4]
        out = {}
        for k, name in enumerate(MEASURES, 1):
            out[name] = dict(first_mb=float(rows[0, k]), last_mb=float(rows[-1, k]),
                             **growth(judged[:, k], FLOOR_MB[name], exact=name == "device"))
        out["rss"] = dict(first_mb=float(rows[0, -1]), last_mb=float(rows[-1, -1]), ok=True)
        return out
