"""Speculative decoding for online c128 (docs/spec.md, speculative decoding): verify V drafts per request in one launch per
layer, keep the state after every draft prefix in a bank, and commit the accepted prefix without
copying state.

The bank is made of slots of each layer's state buffer: V + 1 entries per request, entry j of
request b at slot ``bank_indices[b] + j * bank_stride``, holding the state after the first j
drafts (entry 0: before them). A step of an engine, every index tensor int32 on the device:

    for each c128 layer:  c128_verify(state, drafts, out, ape, load, seq, bank)   # main slots untouched
    (the target model samples; accepted [B] stays on the device)
    once per step:        c128_commit(seq, accepted, load, bank, load_indices=load, num_drafts=V)

`load` then names, for every request, the slot holding the state after its accepted tokens: the
next verify takes it as `indices`, a decode or prefill as `load_indices`. Slots are numbered alike
in every layer's buffer, so one commit serves every layer. `states=[...]` instead copies the
accepted entries onto `indices` in every listed layer in one launch (main slots stay current).
"""
from __future__ import annotations

from . import _fill_speculative
from .errors import ArgumentValueError

__all__ = ["c128_verify", "c128_commit", "C128Verify", "C128Commit", "bank_bytes"]


def bank_bytes(batch_size: int, num_drafts: int, head_dim: int = 512, state_dtype_bytes: int = 4) -> int:
    """Bytes of the bank per layer: (V + 1) state slots per request."""
    for name, v, low in (("batch_size", batch_size, 0), ("num_drafts", num_drafts, 1), ("head_dim", head_dim, 1),
                         ("state_dtype_bytes", state_dtype_bytes, 1)):
        if isinstance(v, bool) or not isinstance(v, int) or v < low:
            raise ArgumentValueError(name, f"{name} must be an int >= {low} (got {v!r})")
    if head_dim % 64:
        raise ArgumentValueError("head_dim", f"head_dim must be a multiple of 64, as a state's D is (got {head_dim})")
    if state_dtype_bytes not in (2, 4):
        raise ArgumentValueError("state_dtype_bytes", f"state_dtype_bytes must be 4 (fp32) or 2 (bf16) (got {state_dtype_bytes})")
    return batch_size * (num_drafts + 1) * 3 * head_dim * state_dtype_bytes


c128_verify = _fill_speculative.c128_verify  # compiled: the call goes straight to its fill
c128_commit = _fill_speculative.c128_commit
# the prepared forms (compiled, over pydsa/_read.pyx's Prepared): arguments judged once, launch() runs them again
C128Verify = _fill_speculative.C128Verify
C128Commit = _fill_speculative.C128Commit

