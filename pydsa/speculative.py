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

from . import _calls
from ._abi import (DEFAULT_PDL_FLAG, FLAG_PDL, FLAG_VERIFY_FP32_BETWEEN_DRAFTS, MAX_DRAFTS, check as _check_status,
                   pdl_flag)
from ._op import DECLINED, Prepared, call_checked, counter_arg, state_arg
from ._tensors import _float32, _int32, arg, as_tensor, optional_arg, rows_arg
from .c128 import CHUNK
from .store import store_arg

__all__ = ["c128_verify", "c128_commit", "C128Verify", "C128Commit", "bank_bytes"]

_fast_verify = _calls.verify
_fast_commit = _calls.commit


def bank_bytes(batch_size: int, num_drafts: int, head_dim: int = 512, state_dtype_bytes: int = 4) -> int:
    """Bytes of the bank per layer: (V + 1) state slots per request."""
    return batch_size * (num_drafts + 1) * 3 * head_dim * state_dtype_bytes


def _stride(bank_stride) -> int:
    if type(bank_stride) is not int or not 1 <= bank_stride < 2**31:
        raise ValueError(f"bank_stride must be an int in 1..2**31-1 (got {bank_stride!r})")
    return bank_stride


def _verify_checked(state, kv_score, out, ape, indices, seq_lens, bank_indices, bank_stride, verify_lens,
                    error_count, store=None, cache_slots=None) -> tuple:
    """The verify's arguments checked (a wrong one raises, naming it) and as tensors; and the device."""
    state, dev, _, d = state_arg(state)
    try:
        b = seq_lens.shape[0]
    except (AttributeError, IndexError):
        b = None
    seq_lens = arg(seq_lens, "seq_lens", _int32, dev, (b,))
    kv_score, rows = rows_arg(kv_score, "kv_score", _float32, dev, 2 * d)
    if b == 0 or rows % b != 0 or not 1 <= rows // b <= MAX_DRAFTS:
        raise ValueError(f"kv_score must have B * V rows with B = seq_lens.shape[0] = {b} and V in 1..{MAX_DRAFTS} "
                         f"(got {rows} rows)")
    return dict(state=state, kv_score=kv_score, out=None if out is None else arg(out, "out", _float32, dev, (rows, d)),
                ape=arg(ape, "ape", _float32, dev, (CHUNK, d)), indices=arg(indices, "indices", _int32, dev, (b,)),
                seq_lens=seq_lens, bank_indices=arg(bank_indices, "bank_indices", _int32, dev, (b,)),
                bank_stride=_stride(bank_stride), verify_lens=optional_arg(verify_lens, "verify_lens", dev, (b,)),
                error_count=counter_arg(error_count, dev), store=store,
                cache_slots=store_arg(store, cache_slots, dev, d, rows)), dev


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
    flags = DEFAULT_PDL_FLAG if pdl is None else FLAG_PDL if pdl else 0  # pdl_flag, inline
    if not round_between_drafts:
        flags |= FLAG_VERIFY_FP32_BETWEEN_DRAFTS
    status = _fast_verify(state, kv_score, out, ape, indices, seq_lens, bank_indices, bank_stride, verify_lens,
                          stream, flags, error_count, store, cache_slots)
    if status:
        if status != DECLINED:
            _check_status(status)  # raises
        if getattr(seq_lens, "shape", None) is not None and tuple(seq_lens.shape) == (0,):
            return
        call_checked(_fast_verify, *_verify_checked(state, kv_score, out, ape, indices, seq_lens, bank_indices,
                                                     bank_stride, verify_lens, error_count, store, cache_slots),
                     stream, flags)


class C128Verify(Prepared):
    """A validated verify over fixed buffers; launch() re-runs it (CUDA-graph capture or replay)."""

    _op = _calls.OP_VERIFY
    _struct = 8

    def __init__(self, state, kv_score, out, ape, indices, seq_lens, bank_indices, *, bank_stride=1,
                 verify_lens=None, store=None, cache_slots=None, pdl=None, error_count=None,
                 round_between_drafts: bool = True):
        self._bind(_calls.fill_verify, _verify_checked,
                   dict(state=state, kv_score=kv_score, out=out, ape=ape, indices=indices, seq_lens=seq_lens,
                        bank_indices=bank_indices, bank_stride=bank_stride, verify_lens=verify_lens,
                        error_count=error_count, store=store, cache_slots=cache_slots),
                   dict(flags=pdl_flag(pdl) | (0 if round_between_drafts else FLAG_VERIFY_FP32_BETWEEN_DRAFTS)))


def _commit_checked(seq_lens, accepted, indices, bank_indices, load_indices, states, num_slots, num_drafts,
                    bank_stride, verify_lens, error_count) -> tuple:
    """The commit's arguments checked (a wrong one raises, naming it) and as tensors; and the device."""
    if type(num_drafts) is not int or not 1 <= num_drafts <= MAX_DRAFTS:
        raise ValueError(f"num_drafts must be an int in 1..{MAX_DRAFTS} (got {num_drafts!r})")
    seq_lens = as_tensor(seq_lens, "seq_lens")
    if seq_lens.dim() != 1:
        raise ValueError(f"seq_lens must have shape [B] (got {list(seq_lens.shape)})")
    dev, b = seq_lens.get_device(), seq_lens.shape[0]
    checked = dict(seq_lens=arg(seq_lens, "seq_lens", _int32, dev, (b,)),
                   accepted=arg(accepted, "accepted", _int32, dev, (b,)),
                   indices=arg(indices, "indices", _int32, dev, (b,)),
                   bank_indices=arg(bank_indices, "bank_indices", _int32, dev, (b,)),
                   verify_lens=optional_arg(verify_lens, "verify_lens", dev, (b,)), num_drafts=num_drafts,
                   bank_stride=_stride(bank_stride), num_slots=num_slots,
                   error_count=counter_arg(error_count, dev),
                   load_indices=None, states=None)
    if (load_indices is None) == (states is None):
        raise ValueError("give exactly one of load_indices (the slots to resolve) and states (the layers to copy)")
    if states is not None:
        if not isinstance(states, (list, tuple)):
            raise TypeError(f"states must be a list of state buffers (got {type(states).__name__})")
        if not states:
            raise ValueError("states must hold at least one state buffer")
        layers = [state_arg(st, f"states[{i}]") for i, st in enumerate(states)]
        shapes = set()
        for i, (st, sdev, _, _) in enumerate(layers):
            if sdev != dev:
                raise ValueError(f"states[{i}] is on {st.device} but seq_lens is on {seq_lens.device}")
            shapes.add((tuple(st.shape), st.dtype))
        if len(shapes) != 1:
            raise ValueError(f"every state buffer in states must have one shape and dtype (got {sorted(map(str, shapes))})")
        checked["states"] = [st for st, _, _, _ in layers]
    else:
        checked["load_indices"] = arg(load_indices, "load_indices", _int32, dev, (b,))
        if type(num_slots) is not int or not 1 <= num_slots < 2**31:
            raise ValueError(f"num_slots must be an int in 1..2**31-1 with load_indices (got {num_slots!r})")
    return checked, dev


def c128_commit(seq_lens, accepted, indices, bank_indices, *, num_drafts, bank_stride=1, verify_lens=None,
                load_indices=None, num_slots=2**31 - 1, states=None, stream=None, pdl=False, error_count=None) -> None:
    """Commits the accepted drafts of a verify step (docs/spec.md, speculative decoding), with no host synchronization.

    seq_lens, indices, bank_indices, bank_stride, verify_lens: as given to c128_verify; accepted [B]
    int32: drafts accepted (clamped to 0..v_b). Either load_indices [B] int32 (may be `indices`
    itself): written with the slot holding each request's state after seq + a_b tokens, for every
    layer at once (num_slots: rows of the state buffers, for the range check); or states, a list of
    state buffers alike: the accepted bank entry is copied onto indices[b] in every one, in one
    launch per 64 layers."""
    flags = FLAG_PDL if pdl else 0
    status = _fast_commit(seq_lens, accepted, indices, bank_indices, load_indices, states, num_slots, num_drafts,
                          bank_stride, verify_lens, stream, flags, error_count)
    if status:
        if status != DECLINED:
            _check_status(status)  # raises
        checked, dev = _commit_checked(seq_lens, accepted, indices, bank_indices, load_indices, states, num_slots,
                                       num_drafts, bank_stride, verify_lens, error_count)
        if checked["states"] is not None and len(checked["states"]) > _STACK_LAYERS:  # pointers off the stack
            C128Commit(seq_lens, accepted, indices, bank_indices, num_drafts=num_drafts, bank_stride=bank_stride,
                       verify_lens=verify_lens, states=states, pdl=pdl, error_count=error_count).launch(stream)
            return
        call_checked(_fast_commit, checked, dev, stream, flags)


_STACK_LAYERS = 256  # a one-shot copying commit's layer pointers on the C stack (pydsa/_calls.pyx)


class C128Commit(Prepared):
    """A validated commit over fixed buffers (c128_commit's arguments); launch() re-runs it, e.g.
    inside the CUDA graph of a speculative step."""

    _op = _calls.OP_COMMIT
    _struct = 9

    def __init__(self, seq_lens, accepted, indices, bank_indices, *, num_drafts, bank_stride=1, verify_lens=None,
                 load_indices=None, num_slots=2**31 - 1, states=None, pdl=False, error_count=None):
        n = len(states) if isinstance(states, (list, tuple)) else 0
        self._layers = (C.c_void_p * max(1, n))()

        def fill_commit(address, **a):
            return _calls.fill_commit(address, C.addressof(self._layers), n, **a)

        self._bind(fill_commit, _commit_checked,
                   dict(seq_lens=seq_lens, accepted=accepted, indices=indices, bank_indices=bank_indices,
                        load_indices=load_indices, states=states, num_slots=num_slots, num_drafts=num_drafts,
                        bank_stride=bank_stride, verify_lens=verify_lens, error_count=error_count),
                   dict(flags=FLAG_PDL if pdl else 0))
