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

import ctypes as C

import torch

from . import _fill_speculative
from ._abi import FLAG_VERIFY_FP32_BETWEEN_DRAFTS, check as _check_status, pdl_flag
from ._op import Prepared
from .errors import ArgumentTypeError, ArgumentValueError

__all__ = ["c128_verify", "c128_commit", "C128Verify", "C128Commit", "bank_bytes"]

_verify = _fill_speculative.verify
_commit = _fill_speculative.commit


def bank_bytes(batch_size: int, num_drafts: int, head_dim: int = 512, state_dtype_bytes: int = 4) -> int:
    """Bytes of the bank per layer: (V + 1) state slots per request."""
    for name, v, low in (("batch_size", batch_size, 0), ("num_drafts", num_drafts, 1), ("head_dim", head_dim, 1),
                         ("state_dtype_bytes", state_dtype_bytes, 1)):
        if isinstance(v, bool) or not isinstance(v, int) or v < low:
            raise ArgumentValueError(name, f"{name} must be an int >= {low} (got {v!r})")
    if state_dtype_bytes not in (2, 4):
        raise ArgumentValueError("state_dtype_bytes", f"state_dtype_bytes must be 4 (fp32) or 2 (bf16) (got {state_dtype_bytes})")
    return batch_size * (num_drafts + 1) * 3 * head_dim * state_dtype_bytes


def _verify_flags(pdl, round_between_drafts, state) -> int:
    """The verify's flags; round_between_drafts is a bool, and False only with a bf16 state (the one it
    applies to)."""
    if round_between_drafts is not True and round_between_drafts is not False:
        raise ArgumentTypeError("round_between_drafts", f"round_between_drafts must be a bool (got {round_between_drafts!r})")
    if not round_between_drafts and getattr(state, "dtype", None) != torch.bfloat16:
        raise ValueError(f"round_between_drafts=False applies to a bf16 state only (state is "
                         f"{getattr(state, 'dtype', type(state).__name__)}: its running state is fp32 already)")
    return pdl_flag(pdl) | (0 if round_between_drafts else FLAG_VERIFY_FP32_BETWEEN_DRAFTS)


def c128_verify(state, kv_score, out, ape, indices, seq_lens, bank_indices, *, bank_stride=1, verify_lens=None,
                store=None, cache_slots=None, stream=None, pdl=None, error_count=None,
                round_between_drafts: bool = True) -> None:
    """Runs each request's drafts through the decode arithmetic (docs/spec.md, speculative decoding) and stores the state after
    every draft prefix in the bank; main slots are never written.

    state [S,1,3D] f32 or bf16 (the bank is slots of it); kv_score [B*V,2D] f32, draft j of request b
    at row b*V+j (V = rows / B, 1..16); out [B*V,D] f32 or None: a chunk closed by draft j goes to row
    b*V+j, other rows untouched; ape [128,D]; indices [B] int32: slot holding the state after seq
    tokens (read when seq is not a multiple of 128); seq_lens [B] int32: committed length before the
    drafts (< 0: padding; 0: a request with no committed tokens); bank_indices [B] int32: slot of bank
    entry 0, entry j at + j*bank_stride; verify_lens [B] int32: drafts of each request (0..V), default V.
    store: a pydsa.KVCache that the vector a draft closes is stored into, at cache_slots[b*V+j] (int64
    [B*V]); an engine ignores the entries of rejected drafts. Nothing with B == 0 rows.
    round_between_drafts False (bf16 state only): the running state stays fp32 from draft to draft,
    each bank entry rounded once, as sglang 0.5.23 keeps it; by default it is rounded as a decode's
    store rounds it, so a verified token leaves exactly the state a decoded one would."""
    status = _verify(state, kv_score, out, ape, indices, seq_lens, bank_indices=bank_indices, bank_stride=bank_stride,
                     verify_lens=verify_lens, store=store, cache_slots=cache_slots, stream=stream,
                     flags=_verify_flags(pdl, round_between_drafts, state), error_count=error_count)
    if status:
        _check_status(status)  # raises


class C128Verify(Prepared):
    """A validated verify over fixed buffers; launch() re-runs it (CUDA-graph capture or replay)."""

    _op, _fill = "verify", staticmethod(_fill_speculative.verify)

    def __init__(self, state, kv_score, out, ape, indices, seq_lens, bank_indices, *, bank_stride=1,
                 verify_lens=None, store=None, cache_slots=None, pdl=None, error_count=None,
                 round_between_drafts: bool = True):
        self._bind(state, kv_score, out, ape, indices, seq_lens, bank_indices=bank_indices, bank_stride=bank_stride,
                   verify_lens=verify_lens, store=store, cache_slots=cache_slots,
                   flags=_verify_flags(pdl, round_between_drafts, state), error_count=error_count)


def c128_commit(seq_lens, accepted, indices, bank_indices, *, num_drafts, bank_stride=1, verify_lens=None,
                load_indices=None, num_slots=2**31 - 1, states=None, stream=None, pdl=False, error_count=None) -> None:
    """Commits the accepted drafts of a verify step (docs/spec.md, speculative decoding), with no host synchronization.

    seq_lens, indices, bank_indices, bank_stride, verify_lens: as given to c128_verify; accepted [B]
    int32: drafts accepted (clamped to 0..v_b). Either load_indices [B] int32 (may be `indices`
    itself): written with the slot holding each request's state after seq + a_b tokens, for every
    layer at once (num_slots: rows of the state buffers, for the range check); or states, a list of
    state buffers alike: the accepted bank entry is copied onto indices[b] in every one, in one
    launch per 64 layers."""
    status = _commit(seq_lens, accepted, indices, bank_indices, num_drafts=num_drafts, bank_stride=bank_stride,
                     verify_lens=verify_lens, load_indices=load_indices, num_slots=num_slots, states=states,
                     stream=stream, flags=pdl_flag(pdl), error_count=error_count)
    if status:
        _check_status(status)  # raises


class C128Commit(Prepared):
    """A validated commit over fixed buffers (c128_commit's arguments); launch() re-runs it, e.g.
    inside the CUDA graph of a speculative step."""

    _op, _fill = "commit", staticmethod(_fill_speculative.commit)

    def __init__(self, seq_lens, accepted, indices, bank_indices, *, num_drafts, bank_stride=1, verify_lens=None,
                 load_indices=None, num_slots=2**31 - 1, states=None, pdl=False, error_count=None):
        n = len(states) if isinstance(states, (list, tuple)) else 0
        self._layers = (C.c_void_p * max(1, n))()
        self._bind(seq_lens, accepted, indices, bank_indices, num_drafts=num_drafts, bank_stride=bank_stride,
                   verify_lens=verify_lens, load_indices=load_indices, num_slots=num_slots, states=states,
                   flags=pdl_flag(pdl), error_count=error_count, layers=C.addressof(self._layers), capacity=n)
