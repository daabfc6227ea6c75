"""The torch way of doing what the kernels do: the baselines the benchmark and the demo time
the library against (and the per-field copy sequence the metadata-copy tests compare with)."""
from __future__ import annotations

import torch

CHUNK = 128


def metadata_copy_torch(src: dict, dst: dict, mode: str = "decode") -> None:
    """The per-field copy_() sequence attention backends run before a graph replay (docs/spec.md, metadata copy)."""
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


def c128_decode_torch(state, kv_score, out, ape, indices, seq_lens) -> None:
    """docs/spec.md, decode in eager torch (boolean masks; padding rows need valid slot indices here)."""
    d = ape.shape[1]
    valid = seq_lens > 0
    pos = (seq_lens.long() - 1).clamp(min=0) % CHUNK
    slots = indices.long()
    m, s, k = state[slots, 0].split(d, dim=1)
    kv, score = kv_score.split(d, dim=1)
    t = score + ape[pos]
    fresh = (pos == 0).unsqueeze(1)
    big = torch.where(fresh, t, torch.maximum(m, t))
    a = torch.where(fresh, torch.zeros_like(s), s * torch.exp(m - big))
    b = torch.exp(t - big)
    total = a + b
    mean = (k * a + kv * b) / total
    close = valid & (pos == CHUNK - 1)
    out[close] = mean[close]
    keep = valid & ~close
    state[slots[keep], 0] = torch.cat([big, total, mean], dim=1)[keep]


def c128_chunks_torch(kv_score: torch.Tensor, ape: torch.Tensor) -> torch.Tensor:
    """Offline softmax over whole aligned chunks of kv_score [N, 2D] (N a multiple of 128):
    the eager torch way of compressing a prefill that starts on a chunk boundary."""
    d = ape.shape[1]
    x = kv_score.view(-1, CHUNK, 2 * d)
    weights = torch.softmax(x[..., d:] + ape, dim=1)
    return (weights * x[..., :d]).sum(dim=1)


def plan_prefill_python(seq_lens, extend_lens):
    """docs/spec.md, the plan in plain Python, one position at a time: (compress, write) lists of
    (ragged_id, batch_id, position, window_len) tuples."""
    compress, write = [], []
    ragged = 0
    for b, (seq, ext) in enumerate(zip(seq_lens, extend_lens)):
        prefix = seq - ext
        start = prefix
        for pos in range(prefix, seq):
            closes = pos % CHUNK == CHUNK - 1
            if closes or pos == seq - 1:
                (compress if closes else write).append((ragged + pos - prefix, b, pos, pos - start + 1))
                start = pos + 1
        ragged += ext
    return compress, write
