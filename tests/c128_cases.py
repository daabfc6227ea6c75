"""Shared by the c128 tests: the state and ape generators and the bounds of the float64 comparison."""
import torch

from reference import BF16_BOUND, CHUNK

POISON = float("nan")
# Norm-wise relative error against the float64 formula: fp32 state (docs/spec.md, the per-token update) and bf16 state
# (docs/spec.md, the state, output layouts: the bound measured over the random schedules below, with margin).
BOUND = {torch.float32: 1e-5, torch.bfloat16: BF16_BOUND}


def random_state(num_slots, d, gen):
    m = torch.randn(num_slots, 1, d, generator=gen) * 2
    s = torch.rand(num_slots, 1, d, generator=gen) * 20 + 1
    k = torch.randn(num_slots, 1, d, generator=gen)
    return torch.cat([m, s, k], dim=2)


def ape_for(d, seed=7):
    return torch.randn(CHUNK, d, generator=torch.Generator().manual_seed(seed))

def _valid(device, d=128, b=2):
    return dict(state=torch.zeros(4, 1, 3 * d, device=device), kv_score=torch.randn(b, 2 * d, device=device),
                out=torch.zeros(b, d, device=device), ape=torch.zeros(CHUNK, d, device=device),
                indices=torch.zeros(b, dtype=torch.int32, device=device),
                seq_lens=torch.ones(b, dtype=torch.int32, device=device))
